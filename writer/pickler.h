// tsar::pickle::Pickler: appends pickle opcodes to a string, as torch.save's
// protocol 2 writes them (plus BINBYTES, and BINUNICODE8 / BINBYTES8 past
// 4 GiB, which every Python 3 unpickler reads in any protocol). Used by the
// .pt exporter and by the pickle reader, which writes objects it does not
// interpret back as opcodes (opaque fragments). No LibTorch.
#pragma once

#include <cstdint>
#include <string>

#include "format/endian.h"

namespace tsar::pickle {

class Pickler {
 public:
  // Appends to *out, which must outlive the Pickler.
  explicit Pickler(std::string* out) : out_(*out) {}

  void Proto() { out_ += "\x80\x02"; }
  void Stop() { out_ += '.'; }
  void Mark() { out_ += '('; }
  void Tuple() { out_ += 't'; }
  void EmptyTuple() { out_ += ')'; }
  void EmptyList() { out_ += ']'; }
  void EmptyDict() { out_ += '}'; }
  void Appends() { out_ += 'e'; }
  void SetItems() { out_ += 'u'; }
  void Reduce() { out_ += 'R'; }
  void Build() { out_ += 'b'; }
  void PersId() { out_ += 'Q'; }
  void Op(uint8_t opcode) { out_ += static_cast<char>(opcode); }
  void Raw(const std::string& bytes) { out_ += bytes; }
  void Global(const std::string& module, const std::string& name) {
    out_ += 'c';
    out_ += module;
    out_ += '\n';
    out_ += name;
    out_ += '\n';
  }
  void Bool(bool b) { out_ += b ? '\x88' : '\x89'; }
  void None() { out_ += 'N'; }
  void Str(const std::string& s) { Sized('X', '\x8d', s); }    // BINUNICODE(8)
  void Bytes(const std::string& s) { Sized('B', '\x8e', s); }  // BINBYTES(8)
  void Int(int64_t v) {
    if (v >= INT32_MIN && v <= INT32_MAX) {
      out_ += 'J';
      Raw32(static_cast<uint32_t>(static_cast<int32_t>(v)));
      return;
    }
    out_ += '\x8a';  // LONG1: little-endian two's complement
    out_ += '\x08';
    Raw64(static_cast<uint64_t>(v));
  }
  // An int of any size as its little-endian two's complement (LONG1 / LONG4).
  void BigInt(const std::string& le) {
    if (le.size() < 256) {
      out_ += '\x8a';
      out_ += static_cast<char>(le.size());
    } else {
      out_ += '\x8b';
      Raw32(static_cast<uint32_t>(le.size()));
    }
    out_ += le;
  }
  void Float(double d) {  // BINFLOAT is big-endian
    out_ += 'G';
    const uint64_t bits = format::DoubleToBits(d);
    for (int i = 7; i >= 0; --i) out_ += static_cast<char>(bits >> (8 * i));
  }
  void Put(uint32_t id) {  // LONG_BINPUT
    out_ += 'r';
    Raw32(id);
  }
  void Get(uint32_t id) {  // LONG_BINGET
    out_ += 'j';
    Raw32(id);
  }
  void OrderedDict() {  // collections.OrderedDict()
    Global("collections", "OrderedDict");
    EmptyTuple();
    Reduce();
  }

 private:
  void Sized(char op4, char op8, const std::string& s) {
    if (s.size() <= UINT32_MAX) {
      out_ += op4;
      Raw32(static_cast<uint32_t>(s.size()));
    } else {
      out_ += op8;
      Raw64(s.size());
    }
    out_ += s;
  }
  void Raw32(uint32_t v) {
    uint8_t b[4];
    format::StoreU32(b, v);
    out_.append(reinterpret_cast<const char*>(b), 4);
  }
  void Raw64(uint64_t v) {
    uint8_t b[8];
    format::StoreU64(b, v);
    out_.append(reinterpret_cast<const char*>(b), 8);
  }
  std::string& out_;
};

}  // namespace tsar::pickle
