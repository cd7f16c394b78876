// The chunked device collectives (device_collectives.h): allreduce,
// all_gather_into_tensor and reduce_scatter_tensor cut into pieces of one
// staging slot each. Each piece is a collective of its own on the host
// group; the three are elementwise or blockwise, so on the host route the
// result is bitwise the CPU path's on the same inputs. On the NCCL route
// inside a host (intraChunks) the reduce-scatter's order of summation and
// its rounding (fp16 and bf16: after each step) are NCCL's, so allreduce
// agrees with the CPU path only within rounding there.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "backend/call_support.h"
#include "backend/device_collectives.h"
#include "backend/process_group.h"
#include "device/reaper.h"

namespace c10d_smddp {

struct DeviceCollectives::Chunked {
  smddp::StagingCall call;
  std::vector<at::Tensor> outputs, read, written, keep;
};

namespace {

at::Tensor hostView(void* slot, size_t offsetBytes, size_t bytes, at::ScalarType st) {
  const auto elems = static_cast<int64_t>(bytes / at::elementSize(st));
  return at::from_blob(static_cast<char*>(slot) + offsetBytes, {elems},
                       at::TensorOptions().dtype(st).device(at::kCPU));
}

void checkDevicePair(const at::Tensor& whole, const at::Tensor& part, const c10::Device& device,
                     int world, const char* coll, const char* wholeName, const char* partName) {
  for (const auto* t : {&whole, &part}) {
    TORCH_CHECK_VALUE(t->defined() && t->device() == device, "smddp ", coll, ": a tensor on ",
                      t->defined() ? t->device() : device, " in a call on ", device);
  }
  (void)toMovedDataType(part, coll);  // a reduce-scatter's reduction is checked by its op
  TORCH_CHECK_TYPE(whole.scalar_type() == part.scalar_type(), "smddp ", coll, ": ", wholeName,
                   " dtype ", whole.scalar_type(), " differs from ", partName, " dtype ",
                   part.scalar_type());
  TORCH_CHECK_VALUE(whole.numel() == part.numel() * world, "smddp ", coll, ": ", wholeName,
                    " size is ", whole.numel(), " elements but must be world size (", world,
                    ") x ", partName, " size (", part.numel(), ")");
}

// Work queued on `waiter` from now on starts after what `after` has
// queued so far; the event goes to the reaper (it may still be pending).
void join(smddp::DeviceStream& waiter, smddp::DeviceStream& after,
          const std::shared_ptr<smddp::Device>& device) {
  smddp::DeviceEventPtr e = after.record();
  waiter.wait(e);
  smddp::DeviceReaper::of(device).release(std::move(e), nullptr);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> DeviceCollectives::launchChunked(c10d::OpType type, const char* coll,
                                                                Chunked& c) {
  auto work = c10::make_intrusive<DeviceWork>(ctx_, rank_, type, coll, c.outputs, timeout_);
  c.call.what = coll;
  return launch(*pipeline_, work, std::move(c.read), std::move(c.written), std::move(c.keep),
                std::move(c.call));
}

namespace {

// An allreduce's tensors: at least one, each on `device`, dense and
// non-overlapping, all of one dtype.
void checkDenseOfOneDtype(const char* coll, const std::vector<at::Tensor>& tensors,
                          const c10::Device& device) {
  TORCH_CHECK_VALUE(!tensors.empty(), "smddp ", coll, ": no tensors given");
  const at::ScalarType st = tensors[0].scalar_type();
  for (const auto& t : tensors) {
    TORCH_CHECK_VALUE(t.defined() && t.device() == device && t.layout() == at::kStrided &&
                          t.is_non_overlapping_and_dense(),
                      "smddp ", coll, ": tensors on ", device,
                      " must be dense and non-overlapping (as with NCCL); call .contiguous() first");
    TORCH_CHECK_TYPE(t.scalar_type() == st, "smddp ", coll,
                     ": all tensors must have the same dtype (got ", st, " and ", t.scalar_type(), ")");
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> DeviceCollectives::allreduce(c10d::OpType type, const char* coll,
                                                            std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  checkNotCapturing(coll);
  checkUsable(coll);
  checkDenseOfOneDtype(coll, tensors, ctx_->torchDevice());
  const at::ScalarType st = tensors[0].scalar_type();
  // Decided at the first allreduce, which every rank makes.
  std::shared_ptr<IntraRoute> intra = intraRouteFor();
  if (!std::all_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) { return t.is_contiguous(); })) {
    // Dense but permuted (channels_last, a transpose): staged whole with
    // the same strides, so the host call reduces logical elements even
    // where ranks lay their tensors out differently.
    return staged(type, coll, tensors, [&](DeviceStage& s) -> HostCall {
      auto h = s.map(tensors, /*read=*/true, /*write=*/true);
      c10d::AllreduceCoalescedOptions o;
      o.reduceOp = s.mapOp(opts.reduceOp);
      o.timeout = opts.timeout;
      return [h, o](ProcessGroupSmddp& pg) mutable { return pg.allreduce_coalesced(h, o); };
    });
  }
  auto entered = ctx_->enter();
  Chunked c;
  // PREMUL_SUM's factor, when on the device, lands first, as a chunk of its own.
  DeviceStage prelude(*ctx_, *pool_, coll);
  c10d::AllreduceOptions hostOpts = opts;
  hostOpts.reduceOp = prelude.mapOp(opts.reduceOp);
  hostOpts.asyncOp = false;  // the pipeline thread waits at once
  std::optional<double> factor;  // dtype and op, with the CPU path's checks and messages
  const smddp::DataType dt = toDataType(tensors[0], coll);
  const smddp::ReduceOp sop = toReduceOpScaled(hostOpts.reduceOp, dt, coll, &factor);
  if (!prelude.chunk_.in.empty()) c.call.chunks.push_back(std::move(prelude.chunk_));
  const bool viaIntra = intra && !factor && smddp::intraHostSupports(dt, sop);

  const size_t elem = tensors[0].element_size();
  const size_t chunkBytes = std::max(elem, pipeline_->slotBytes() / elem * elem);
  auto hostWork = [host = host_, watch = watch_, st, hostOpts](void* slot, size_t bytes) {
    std::vector<at::Tensor> v{hostView(slot, 0, bytes, st)};
    if (auto w = formedHost(*host, *watch).allreduce(v, hostOpts)) w->wait();
  };
  smddp::StagingChunk cur;
  size_t used = 0;
  auto flush = [&] {
    cur.slotted = true;
    cur.out = cur.in;  // in place: each piece goes back where it came from
    cur.host = [hostWork, used](void* slot) { hostWork(slot, used); };
    c.call.chunks.push_back(std::move(cur));
    cur = smddp::StagingChunk{};
    used = 0;
  };
  size_t total = 0;
  for (const auto& t : tensors) {
    auto* base = static_cast<uint8_t*>(t.data_ptr());
    const size_t bytes = static_cast<size_t>(t.numel()) * elem;
    total += bytes;
    // Through the host's GPUs, all but the last few elements (fewer than
    // the GPUs), which take the host path like every other chunk here.
    const size_t start = viaIntra ? (static_cast<size_t>(t.numel()) - intraChunks(c, t, dt, sop, hostOpts)) * elem : 0;
    for (size_t off = start; off < bytes;) {
      const size_t n = std::min(bytes - off, chunkBytes - used);
      cur.in.push_back({base + off, reinterpret_cast<void*>(used), n});
      used += n;
      off += n;
      if (used == chunkBytes) flush();
    }
  }
  // An empty call still meets its peers on the host group (sizes that
  // differ across ranks are then reported there).
  if (used > 0 || total == 0) flush();
  c.outputs = tensors;
  c.read = tensors;
  c.read.insert(c.read.end(), prelude.read_.begin(), prelude.read_.end());
  c.written = tensors;
  c.keep = tensors;
  c.keep.insert(c.keep.end(), prelude.keep_.begin(), prelude.keep_.end());
  return launchChunked(type, coll, c);
}

size_t DeviceCollectives::intraChunks(Chunked& c, const at::Tensor& t, smddp::DataType dt,
                                      smddp::ReduceOp op, const c10d::AllreduceOptions& railOpts) {
  std::shared_ptr<IntraRoute> route = std::atomic_load(&intra_);
  std::shared_ptr<smddp::Device> device = ctx_->device();
  const size_t g = static_cast<size_t>(route->host->size());
  const size_t elem = t.element_size();
  const size_t shardMax = pipeline_->slotBytes() / elem;
  const at::ScalarType st = t.scalar_type();
  auto* base = static_cast<uint8_t*>(t.data_ptr());
  const size_t n = static_cast<size_t>(t.numel());
  size_t off = 0;
  // Per chunk of g x `per` elements: reduce-scatter over the host's GPUs
  // into the slot's device shard, copy the shard in; host work: allreduce
  // it over the rail (one rank per host); copy it back; all-gather. The
  // collectives, and the shard's copy back, run on the communicator's own
  // stream (issue 53, defect 3). It waits only for the call's readiness
  // event, never for a shared copy stream, which may hold waits for
  // another group's kernels in an order each GPU picks for itself; the
  // copy streams wait for it (no queue waits for the host either way).
  while (n - off >= g) {
    const size_t per = std::min(shardMax, (n - off) / g);
    uint8_t* data = base + off * elem;
    const size_t bytes = per * elem;
    smddp::StagingChunk chunk;
    chunk.slotted = true;
    chunk.beforeIn = [route, device, data, per, bytes, dt, op](smddp::DeviceStream& in, int slot,
                                                               void* slotBase,
                                                               const smddp::DeviceEventPtr& ready) {
      void* shard = route->scratch[static_cast<size_t>(slot)].data_ptr();
      smddp::DeviceStream& own = *route->stream;
      own.wait(ready);  // the inputs; the shard's last reader ran on `own`
      route->host->reduceScatter(own, data, shard, per, dt, op);
      join(in, own, device);
      in.copy(slotBase, shard, bytes);
    };
    chunk.host = [route, per, st, railOpts, watch = watch_](void* slot) {
      route->host->checkHealthy();
      if (route->hosts < 2) return;
      std::vector<at::Tensor> v{hostView(slot, 0, per * at::elementSize(st), st)};
      // The rail's peer may wait on a dead local peer of its own host: the
      // watch sees that death here, well before the rail's timeout. So the
      // rail's call runs on its engine thread (asyncOp), not inline on
      // this one, which polls it meanwhile.
      c10d::AllreduceOptions queued = railOpts;
      queued.asyncOp = true;
      if (auto w = route->rail->allreduce(v, queued)) waitWatched(*w, *watch, "all_reduce");
    };
    chunk.afterOut = [route, device, data, per, bytes, dt](smddp::DeviceStream& out, int slot,
                                                           void* slotBase) {
      void* shard = route->scratch[static_cast<size_t>(slot)].data_ptr();
      smddp::DeviceStream& own = *route->stream;
      own.copy(shard, slotBase, bytes);  // the slot is final: its host work has run
      route->host->allGather(own, shard, data, per, dt);
      join(out, own, device);  // the slot's reuse, the call's end: after both
    };
    c.call.chunks.push_back(std::move(chunk));
    off += per * g;
  }
  return n - off;
}

size_t DeviceCollectives::gatherPiece(size_t elem) const {
  return pipeline_->slotBytes() / static_cast<size_t>(world_ + 1) / elem * elem;
}

bool DeviceCollectives::chunkableParts(const std::vector<at::Tensor>& parts,
                                       const at::Tensor& like) const {
  const c10::Device device = ctx_->torchDevice();
  auto fits = [&](const at::Tensor& t) {
    return t.defined() && t.is_contiguous() && t.device() == device &&
           t.scalar_type() == like.scalar_type() && t.numel() == like.numel();
  };
  return static_cast<int>(parts.size()) == world_ && fits(like) &&
         std::all_of(parts.begin(), parts.end(), fits) && gatherPiece(like.element_size()) > 0;
}

c10::intrusive_ptr<c10d::Work> DeviceCollectives::allgatherBase(at::Tensor& output,
                                                                at::Tensor& input) {
  const char* coll = "all_gather_into_tensor";
  if (!output.is_contiguous() || !input.is_contiguous()) return {};
  if (gatherPiece(input.element_size()) == 0) return {};
  checkDevicePair(output, input, ctx_->torchDevice(), world_, coll, "output", "input");
  const size_t bytes = static_cast<size_t>(input.numel()) * input.element_size();
  std::vector<uint8_t*> outs;
  for (int r = 0; r < world_; ++r) outs.push_back(static_cast<uint8_t*>(output.data_ptr()) + r * bytes);
  return gatherChunked(c10d::OpType::_ALLGATHER_BASE, coll, input, outs, {output});
}

c10::intrusive_ptr<c10d::Work> DeviceCollectives::allgatherList(std::vector<at::Tensor>& outputs,
                                                                at::Tensor& input) {
  if (!chunkableParts(outputs, input)) return {};
  (void)toMovedDataType(input, "all_gather");
  std::vector<uint8_t*> outs;
  for (auto& o : outputs) outs.push_back(static_cast<uint8_t*>(o.data_ptr()));
  return gatherChunked(c10d::OpType::ALLGATHER, "all_gather", input, outs, outputs);
}

c10::intrusive_ptr<c10d::Work> DeviceCollectives::gatherChunked(
    c10d::OpType type, const char* coll, const at::Tensor& input, const std::vector<uint8_t*>& outs,
    const std::vector<at::Tensor>& outputs) {
  checkNotCapturing(coll);
  checkUsable(coll);
  auto entered = ctx_->enter();
  Chunked c;
  const size_t piece = gatherPiece(input.element_size());
  const size_t bytes = static_cast<size_t>(input.numel()) * input.element_size();
  auto* in = static_cast<uint8_t*>(input.data_ptr());
  const at::ScalarType st = input.scalar_type();
  // Slot layout of a piece of n bytes: [this rank's n | world x n gathered].
  for (size_t a = 0; a < bytes || (bytes == 0 && c.call.chunks.empty()); a += piece) {
    const size_t n = std::min(piece, bytes - a);
    smddp::StagingChunk chunk;
    chunk.slotted = true;
    if (n > 0) chunk.in.push_back({in + a, nullptr, n});
    for (int r = 0; r < world_ && n > 0; ++r) {
      chunk.out.push_back({outs[static_cast<size_t>(r)] + a, reinterpret_cast<void*>(n + r * n), n});
    }
    chunk.host = [host = host_, watch = watch_, n, st, world = world_](void* slot) {
      at::Tensor i = hostView(slot, 0, n, st), o = hostView(slot, n, world * n, st);
      if (auto w = formedHost(*host, *watch)._allgather_base(o, i, c10d::AllgatherOptions())) {
        w->wait();
      }
    };
    c.call.chunks.push_back(std::move(chunk));
    if (bytes == 0) break;
  }
  c.outputs = outputs;
  c.read = {input};
  c.written = outputs;
  c.keep = outputs;
  c.keep.push_back(input);
  return launchChunked(type, coll, c);
}

c10::intrusive_ptr<c10d::Work> DeviceCollectives::reduceScatterBase(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const char* coll = "reduce_scatter_tensor";
  if (!output.is_contiguous() || !input.is_contiguous()) return {};
  if (gatherPiece(output.element_size()) == 0) return {};
  checkDevicePair(input, output, ctx_->torchDevice(), world_, coll, "input", "output");
  const size_t bytes = static_cast<size_t>(output.numel()) * output.element_size();
  std::vector<uint8_t*> ins;
  for (int r = 0; r < world_; ++r) ins.push_back(static_cast<uint8_t*>(input.data_ptr()) + r * bytes);
  return scatterChunked(c10d::OpType::_REDUCE_SCATTER_BASE, coll, ins, {input}, output, opts);
}

c10::intrusive_ptr<c10d::Work> DeviceCollectives::reduceScatterList(
    at::Tensor& output, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  if (!chunkableParts(inputs, output)) return {};
  std::vector<uint8_t*> ins;
  for (auto& t : inputs) ins.push_back(static_cast<uint8_t*>(t.data_ptr()));
  return scatterChunked(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", ins, inputs, output, opts);
}

c10::intrusive_ptr<c10d::Work> DeviceCollectives::scatterChunked(
    c10d::OpType type, const char* coll, const std::vector<uint8_t*>& ins,
    const std::vector<at::Tensor>& inputs, const at::Tensor& output,
    const c10d::ReduceScatterOptions& opts) {
  checkNotCapturing(coll);
  checkUsable(coll);
  auto entered = ctx_->enter();
  Chunked c;
  DeviceStage prelude(*ctx_, *pool_, coll);
  c10d::ReduceScatterOptions hostOpts = opts;
  hostOpts.reduceOp = prelude.mapOp(opts.reduceOp);
  hostOpts.asyncOp = false;
  std::optional<double> factor;
  (void)toReduceOpScaled(hostOpts.reduceOp, toDataType(output, coll), coll, &factor);
  if (!prelude.chunk_.in.empty()) c.call.chunks.push_back(std::move(prelude.chunk_));
  const size_t piece = gatherPiece(output.element_size());
  const size_t bytes = static_cast<size_t>(output.numel()) * output.element_size();
  auto* out = static_cast<uint8_t*>(output.data_ptr());
  const at::ScalarType st = output.scalar_type();
  // Slot layout of a piece of n bytes: [world x n to reduce | n reduced].
  bool any = false;
  for (size_t a = 0; a < bytes || !any; a += piece) {
    any = true;
    const size_t n = std::min(piece, bytes - a);
    smddp::StagingChunk chunk;
    chunk.slotted = true;
    for (int r = 0; r < world_ && n > 0; ++r) {
      chunk.in.push_back({ins[static_cast<size_t>(r)] + a, reinterpret_cast<void*>(r * n), n});
    }
    if (n > 0) chunk.out.push_back({out + a, reinterpret_cast<void*>(world_ * n), n});
    chunk.host = [host = host_, watch = watch_, n, st, world = world_, hostOpts](void* slot) {
      at::Tensor i = hostView(slot, 0, world * n, st), o = hostView(slot, world * n, n, st);
      if (auto w = formedHost(*host, *watch)._reduce_scatter_base(o, i, hostOpts)) w->wait();
    };
    c.call.chunks.push_back(std::move(chunk));
    if (bytes == 0) break;
  }
  c.outputs = {output};
  c.read = inputs;
  c.read.insert(c.read.end(), prelude.read_.begin(), prelude.read_.end());
  c.written = {output};
  c.keep = inputs;
  c.keep.push_back(output);
  c.keep.insert(c.keep.end(), prelude.keep_.begin(), prelude.keep_.end());
  return launchChunked(type, coll, c);
}

}  // namespace c10d_smddp
