// A minimal writer of Python pickles (protocol 2): dicts, lists, tuples,
// strings, integers, floats, booleans and None, which is all a flight
// recorder dump in torch's format holds (torch_fr.h). Torch-free: the dump
// is written where a call failed, with no Python at hand.
#pragma once

#include <cstdint>
#include <string>

namespace smddp {

class PickleWriter {
 public:
  PickleWriter() { out_ += "\x80\x02"; }  // PROTO 2

  // Containers: open, then items (for a dict: key, value, key, value...),
  // then close with the same kind.
  void beginDict() { out_ += "}("; }    // EMPTY_DICT MARK
  void endDict() { out_ += 'u'; }       // SETITEMS
  void beginList() { out_ += "]("; }    // EMPTY_LIST MARK
  void endList() { out_ += 'e'; }       // APPENDS
  void beginTuple() { out_ += '('; }    // MARK
  void endTuple() { out_ += 't'; }      // TUPLE

  void str(const std::string& s);
  void integer(int64_t v);
  void real(double v);
  void boolean(bool v) { out_ += v ? '\x88' : '\x89'; }
  void none() { out_ += 'N'; }

  // The pickle, STOP appended; the writer is spent afterwards.
  std::string finish() {
    out_ += '.';
    return std::move(out_);
  }

 private:
  std::string out_;
};

}  // namespace smddp
