// Flight recorder dumps in torch's own format, so that torch's analyzer
// (`torchfrtrace`, torch/distributed/flight_recorder) reads them as they
// are: one pickle per rank at TORCH_FR_DUMP_TEMP_FILE<rank>, holding every
// live group's entries. smddp's own JSON dumps (SMDDP_DEBUG_DIR) stay, for
// the desync report and `python -m torch_smddp.trace`.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace smddp {

class FlightRecorder;

// TORCH_FR_DUMP_TEMP_FILE: the path prefix of torch-format dumps ("" for none).
std::string torchDumpPrefix();

// Every recorder alive in this process, for a dump that covers all groups.
void registerRecorder(const std::shared_ptr<const FlightRecorder>& rec);

// torch's dump of the process's live recorders: {"version", "pg_config",
// "pg_status", "entries"} as torch 2.13 writes it.
std::string torchFlightRecordPickle(int globalRank);

// Writes it to TORCH_FR_DUMP_TEMP_FILE<globalRank>; returns the path, or ""
// when the prefix is unset or the write failed.
std::string dumpTorchFlightRecord(int globalRank);

}  // namespace smddp
