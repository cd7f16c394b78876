// Shared by the backend's collectives: argument validation that names the
// collective, dtype/op mapping onto the engine's enums, contiguous staging
// for non-contiguous tensors, and the glue that turns an engine callback
// into a completed WorkSmddp.
#pragma once

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "backend/torch_compat.h"

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "backend/work.h"
#include "common/error.h"
#include "engine/communicator.h"

namespace c10d_smddp {

using smddp::Buffer;
using smddp::DataType;


// The engine's dtype for a tensor's, or none where the engine has none
// (complex, which dist.all_reduce views as real; the rest are unsupported).
inline std::optional<DataType> engineDataType(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kChar: return DataType::kInt8;
    case at::kByte: return DataType::kUInt8;
    case at::kInt: return DataType::kInt32;
    case at::kLong: return DataType::kInt64;
    case at::kBool: return DataType::kBool;
    default: return std::nullopt;
  }
}

// Dtypes the engine cannot reduce but can move: a call that only moves
// bytes (broadcast, all_gather, all_to_all, gather, scatter, send/recv)
// takes them as the engine dtype of the same element size, which it copies
// bit for bit (issue 53, defect 8).
inline bool movableOnly(at::ScalarType t) {
  return t == at::kShort || t == at::kUInt16 || t == at::kUInt32 || t == at::kUInt64 ||
         c10::isFloat8Type(t);
}

inline DataType toDataType(const at::Tensor& t, const char* op) {
  const std::optional<DataType> dt = engineDataType(t.scalar_type());
  TORCH_CHECK_TYPE(dt.has_value(), "smddp ", op, " does not support dtype ", t.scalar_type(),
                   movableOnly(t.scalar_type()) ? " in a reduction (calls that only move data "
                                                  "take it)" : "",
                   ": supported dtypes are float32, float64, float16, bfloat16, int8, "
                   "uint8, int32, int64 and bool");
  return *dt;
}

// toDataType for a call that only moves data: also int16, uint16/32/64 and
// float8, as the engine's dtype of their element size.
inline DataType toMovedDataType(const at::Tensor& t, const char* op) {
  if (movableOnly(t.scalar_type())) {
    switch (t.element_size()) {
      case 1: return DataType::kUInt8;
      case 2: return DataType::kFloat16;  // copied, never converted
      case 4: return DataType::kInt32;
      default: return DataType::kInt64;
    }
  }
  const std::optional<DataType> dt = engineDataType(t.scalar_type());
  TORCH_CHECK_TYPE(dt.has_value(), "smddp ", op, " does not support dtype ", t.scalar_type(),
                   ": supported dtypes are float32, float64, float16, bfloat16, int8, uint8, "
                   "int32, int64 and bool, and for calls that only move data also int16, "
                   "uint16, uint32, uint64 and float8");
  return *dt;
}

inline smddp::ReduceOp toReduceOp(const c10d::ReduceOp& op, DataType dt, const char* coll) {
  smddp::ReduceOp r;
  switch (op.op_) {
    case c10d::ReduceOp::SUM: r = smddp::ReduceOp::kSum; break;
    case c10d::ReduceOp::AVG: r = smddp::ReduceOp::kAvg; break;
    case c10d::ReduceOp::PRODUCT: r = smddp::ReduceOp::kProduct; break;
    case c10d::ReduceOp::MIN: r = smddp::ReduceOp::kMin; break;
    case c10d::ReduceOp::MAX: r = smddp::ReduceOp::kMax; break;
    case c10d::ReduceOp::BAND: r = smddp::ReduceOp::kBand; break;
    case c10d::ReduceOp::BOR: r = smddp::ReduceOp::kBor; break;
    case c10d::ReduceOp::BXOR: r = smddp::ReduceOp::kBxor; break;
    default:
      TORCH_CHECK_VALUE(false, "smddp ", coll, " does not support reduce op ",
                        static_cast<int>(op.op_), " (PREMUL_SUM is not implemented)");
  }
  std::string why;
  TORCH_CHECK_VALUE(smddp::isSupported(r, dt, &why), "smddp ", coll, ": ", smddp::toString(r),
                    " on ", smddp::toString(dt), " is not supported: ", why);
  return r;
}

// PREMUL_SUM(f) reduces f * x_i with SUM. The engine only sums, so the
// backend scales a private copy of each input (Staging::stageScaled) and
// hands kSum to the engine. Floating dtypes only, as in NCCL. Call sites that
// do not scale use toReduceOp, which keeps refusing PREMUL_SUM, so no path can
// silently drop the factor.
inline smddp::ReduceOp toReduceOpScaled(const c10d::ReduceOp& op, DataType dt, const char* coll,
                                        std::optional<double>* factor) {
  factor->reset();
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return toReduceOp(op, dt, coll);
  TORCH_CHECK_VALUE(dt == DataType::kFloat32 || dt == DataType::kFloat64 ||
                        dt == DataType::kFloat16 || dt == DataType::kBFloat16,
                    "smddp ", coll, ": PREMUL_SUM is only supported on floating dtypes, got ",
                    smddp::toString(dt));
  auto* sup = dynamic_cast<PreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK_VALUE(sup != nullptr, "smddp ", coll, ": PREMUL_SUM without a factor");
  if (sup->tensor_factor.defined()) {
    TORCH_CHECK_VALUE(sup->tensor_factor.numel() == 1, "smddp ", coll,
                      ": the PREMUL_SUM factor tensor must have one element, got ",
                      sup->tensor_factor.numel());
    *factor = sup->tensor_factor.to(at::kCPU).item<double>();
  } else {
    *factor = sup->double_factor;
  }
  return smddp::ReduceOp::kSum;
}

// Every tensor of a list of lists, in order (Work::result() of such calls).
inline std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

inline void checkTensor(const at::Tensor& t, const char* op) {
  TORCH_CHECK_VALUE(t.defined(), "smddp ", op, ": undefined tensor");
  TORCH_CHECK_VALUE(t.device().is_cpu(), "smddp ", op, ": only CPU tensors reach the engine (got ",
                    t.device(), ")");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, "smddp ", op,
                    ": only dense (strided) tensors are supported, got layout ", t.layout());
}

// How a call uses a tensor it is handed.
enum class Use {
  kIn,     // read only (a send buffer, an all-gather input)
  kOut,    // written in full, never read (an all-gather output)
  kInOut,  // read, then written (allreduce, broadcast, reduce)
};

// Non-contiguous tensors, and inputs a PREMUL_SUM factor scales, reach the
// engine as private contiguous copies. A copy is filled (preparer) on the
// engine's worker just before its engine call runs, after every earlier
// call has completed and copied its own result back, and its result is
// copied back (finisher) as soon as that engine call succeeds, before any
// later call starts. So a call whose input is a view of memory that an
// earlier queued call writes reads that call's result, for every
// collective and for sends: call order, as NCCL and MPI keep. A coalesced
// call is one engine call per part, each with its own copies: a part reads
// what the parts before it wrote.
struct Staging {
  struct Part {
    std::vector<std::function<void()>> copyIn;                // fills, in order
    std::vector<std::pair<at::Tensor, at::Tensor>> copyBack;  // (user, staged)
  };
  std::vector<at::Tensor> work;  // the contiguous tensors the engine sees
  std::vector<Part> parts;

  Part& part(size_t i) {
    if (parts.size() <= i) parts.resize(i + 1);
    return parts[i];
  }
  at::Tensor stage(const at::Tensor& t, Use use, size_t partIndex = 0) {
    if (t.is_contiguous()) {
      work.push_back(t);
      return t;
    }
    at::Tensor c = at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
    work.push_back(c);
    Part& p = part(partIndex);
    if (use != Use::kOut) p.copyIn.push_back([c, t]() mutable { c.copy_(t); });
    if (use != Use::kIn) p.copyBack.emplace_back(t, c);
    return c;
  }
  // The engine reads factor * t, a private contiguous tensor; with
  // copyBackTo the result lands in `t` (in-place collectives). The caller's
  // input itself is never modified before the collective runs.
  at::Tensor stageScaled(const at::Tensor& t, double factor, bool copyBackTo,
                         size_t partIndex = 0) {
    at::Tensor c = at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
    work.push_back(c);
    Part& p = part(partIndex);
    p.copyIn.push_back([c, t, factor]() mutable { c.copy_(t.mul(factor)); });
    if (copyBackTo) p.copyBack.emplace_back(t, c);
    return c;
  }
  // A read-only input, scaled when a PREMUL_SUM factor is set.
  at::Tensor stageInput(const at::Tensor& t, const std::optional<double>& factor,
                        size_t partIndex = 0) {
    return factor ? stageScaled(t, *factor, false, partIndex) : stage(t, Use::kIn, partIndex);
  }
  // An in-place reduction's tensor (allreduce), scaled when a factor is set.
  at::Tensor stageInPlace(const at::Tensor& t, const std::optional<double>& factor,
                          size_t partIndex = 0) {
    return factor ? stageScaled(t, *factor, true, partIndex) : stage(t, Use::kInOut, partIndex);
  }
  // Part i's copy-in, for CallHooks::prepare (null when there is none).
  std::function<void()> preparer(size_t i) const {
    if (i >= parts.size() || parts[i].copyIn.empty()) return nullptr;
    return [fills = parts[i].copyIn] {
      for (const auto& fill : fills) fill();
    };
  }
  // Part i's copy-back, run when its engine call succeeded (null: none).
  std::function<void()> finisher(size_t i) const {
    if (i >= parts.size() || parts[i].copyBack.empty()) return nullptr;
    return [pairs = parts[i].copyBack] {
      for (const auto& [user, staged] : pairs) user.copy_(staged);
    };
  }
};

// The bytes of storage a (strided, never negatively) view spans: what the
// engine compares to keep calls on overlapping tensors in call order.
inline smddp::MemRange extentOf(const at::Tensor& t) {
  if (t.numel() == 0) return {};
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  return {begin, begin + static_cast<uintptr_t>((last + 1) * t.element_size())};
}

// Whether `t` likely lies on transparent huge pages (Buffer::hugePages):
// torch allocated its storage, 2 MiB or more, with THP_MEM_ALLOC_ENABLE=1,
// where the kernel gives huge pages (process_group_alloc.cc).
bool onHugePages(const at::Tensor& t);

inline Buffer bufferOf(const at::Tensor& t) {
  return Buffer{t.data_ptr(), static_cast<uint64_t>(t.numel())};
}

// An all-gather's input, marked when it likely lies on huge pages: the
// only buffer the mark changes anything for (SegmentCollectives::stagePart).
inline Buffer gatherInputOf(const at::Tensor& t) {
  return Buffer{t.data_ptr(), static_cast<uint64_t>(t.numel()), onHugePages(t)};
}

// Engine errors raised before anything was queued (e.g. shut down).
[[noreturn]] inline void rethrowAsTorch(const smddp::Error& e) {
  C10_THROW_ERROR(DistBackendError, e.what());
}


// Several engine collectives behind one Work: it completes when the last
// one does, with the first error if any failed (the coalesced variants).
class Countdown {
 public:
  Countdown(c10::intrusive_ptr<WorkSmddp> work, int count) : work_(std::move(work)), left_(count) {}
  void done(std::exception_ptr e) {
    std::exception_ptr finalError;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (e && !error_) error_ = e;
      if (--left_ > 0) return;
      finalError = error_;
    }
    work_->complete(finalError);
  }

 private:
  c10::intrusive_ptr<WorkSmddp> work_;
  std::mutex mu_;
  int left_;                   // guarded by mu_
  std::exception_ptr error_;   // guarded by mu_
};

// Queues `count` engine calls (the parts of one c10d call) behind one Work,
// which completes when the last one does, with the first error if any.
// startPart(i, done, hooks) queues part i and returns its sequence number;
// hooks.prepare fills part i's staging copies on the worker;
// `callerWaits` lets each part run on the caller's thread
// (CallHooks::callerWaits). Each part's
// completion copies its staged results back, then counts down. The
// completions own the staged tensors: the engine keeps a completion (so
// the memory) until nothing it posted can still touch that memory.
template <typename StartPart>
c10::intrusive_ptr<c10d::Work> launchParts(int rank, c10d::OpType type, const char* title,
                                           std::vector<at::Tensor> outputs,
                                           const std::vector<at::Tensor>& inputs,
                                           const Staging& staging, int count,
                                           bool callerWaits, StartPart startPart) {
  auto work = c10::make_intrusive<WorkSmddp>(rank, type, title, std::move(outputs), inputs);
  if (count == 0) {
    work->complete(nullptr);
    return work;
  }
  auto keep = std::make_shared<std::vector<at::Tensor>>(staging.work);
  auto countdown = std::make_shared<Countdown>(work, count);
  uint64_t seq = 0;
  for (int i = 0; i < count; ++i) {
    smddp::CallHooks hooks;
    hooks.prepare = staging.preparer(static_cast<size_t>(i));
    hooks.callerWaits = callerWaits;
    auto done = [countdown, keep, finish = staging.finisher(static_cast<size_t>(i))](
                    std::exception_ptr e) {
      if (!e && finish) {
        try {
          finish();
        } catch (...) {
          e = std::current_exception();
        }
      }
      countdown->done(e);
    };
    seq = startPart(i, std::move(done), std::move(hooks));
  }
  work->setSequence(seq);
  return work;
}

}  // namespace c10d_smddp
