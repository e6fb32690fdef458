// A small pickle virtual machine for torch.save's data.pkl that never executes
// anything: globals come from a fixed allow-list and are interpreted here
// (writer/pickle_globals.cc). This file runs the opcodes and keeps the memo;
// writer/pickle_tree.cc hands the result out as a tree.
#include "writer/pickle.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "format/endian.h"
#include "format/reader.h"
#include "writer/pickle_machine.h"

namespace tsar::pickle {
namespace detail {

using format::Quote;

uint32_t Machine::ReadString(uint64_t n) {
  const bool bytes = op_ == op::kShortBinBytes || op_ == op::kBinBytes || op_ == op::kBinBytes8;
  const NodeKind kind = bytes ? NodeKind::kBytes : NodeKind::kString;
  const uint8_t* p = Take(n);
  uint32_t id = New(kind);
  At(id).s.assign(reinterpret_cast<const char*>(p), n);
  // torch.load decodes protocol-0/1 strings as UTF-8 too, so one check covers all.
  if (kind == NodeKind::kString && !format::IsValidUtf8(At(id).s)) {
    Fail("string " + Quote(At(id).s) + ": expected valid UTF-8");
  }
  return id;
}

std::string Machine::ReadLine() {
  size_t avail = std::min(size_ - pos_, kMaxGlobalLine + 1);
  const void* nl = std::memchr(data_ + pos_, '\n', avail);
  if (nl == nullptr) {
    Fail("GLOBAL: expected a newline-terminated name of at most " + std::to_string(kMaxGlobalLine) +
         " bytes");
  }
  size_t n = static_cast<const uint8_t*>(nl) - (data_ + pos_);
  std::string line(reinterpret_cast<const char*>(Take(n + 1)), n);
  return line;
}

Result Machine::Run() {
  for (;;) {
    op_offset_ = pos_;
    if (pos_ == size_) Fail("expected an opcode, found the end of data (no STOP)");
    op_ = *Take(1);
    switch (op_) {
      case op::kProto: {
        uint8_t version = *Take(1);
        if (version > 5) Fail("PROTO: expected protocol <= 5, found " + std::to_string(version));
        break;
      }
      case op::kFrame:
        Take(8);
        break;  // frames only group bytes; the opcodes inside count
      case op::kMark:
        marks_.push_back(stack_.size());
        break;
      case op::kPop:
        Pop();
        break;
      case op::kPopMark:
        PopMark();
        break;
      case op::kNone:
      case op::kNewTrue:
      case op::kNewFalse:
        stack_.push_back(op_ == op::kNone ? kNoneId : op_ == op::kNewTrue ? kTrueId : kFalseId);
        break;
      case op::kBinInt1:
        stack_.push_back(NewInt(*Take(1)));
        break;
      case op::kBinInt2:
        stack_.push_back(NewInt(format::LoadU16(Take(2))));
        break;
      case op::kBinInt:
        stack_.push_back(NewInt(static_cast<int32_t>(format::LoadU32(Take(4)))));
        break;
      case op::kLong1:
      case op::kLong4: {
        // Little-endian two's complement of n bytes: an int64, or a bigint
        // kept as its shortest encoding.
        uint64_t n = op_ == op::kLong1 ? *Take(1) : format::LoadU32(Take(4));
        const uint8_t* p = Take(n);
        while (n > 1 && ((p[n - 1] == 0x00 && !(p[n - 2] & 0x80)) ||
                         (p[n - 1] == 0xFF && (p[n - 2] & 0x80)))) {
          --n;  // a redundant sign byte
        }
        if (n > 8) {
          uint32_t id = New(NodeKind::kBigInt);
          At(id).s.assign(reinterpret_cast<const char*>(p), n);
          stack_.push_back(id);
          break;
        }
        uint64_t v = 0;
        for (uint64_t k = 0; k < n; ++k) v |= uint64_t{p[k]} << (8 * k);
        if (n > 0 && n < 8 && (p[n - 1] & 0x80)) v |= ~uint64_t{0} << (8 * n);
        stack_.push_back(NewInt(static_cast<int64_t>(v)));
        break;
      }
      case op::kBinFloat: {  // the one big-endian field of the pickle format
        const uint8_t* p = Take(8);
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k) bits = (bits << 8) | p[k];
        uint32_t id = New(NodeKind::kFloat);
        At(id).f = format::BitsToDouble(bits);
        stack_.push_back(id);
        break;
      }
      case op::kShortBinUnicode:
      case op::kShortBinString:
      case op::kShortBinBytes:
        stack_.push_back(ReadString(*Take(1)));
        break;
      case op::kBinUnicode:
      case op::kBinString:  // its i32 length read as u32: a negative one fails in Take
      case op::kBinBytes:
        stack_.push_back(ReadString(format::LoadU32(Take(4))));
        break;
      case op::kBinUnicode8:
      case op::kBinBytes8:
        stack_.push_back(ReadString(format::LoadU64(Take(8))));
        break;
      case op::kEmptyList:
      case op::kEmptyDict:
      case op::kEmptyTuple:
        stack_.push_back(New(op_ == op::kEmptyList   ? NodeKind::kList
                             : op_ == op::kEmptyDict ? NodeKind::kDict
                                                     : NodeKind::kTuple));
        break;
      case op::kList:
        stack_.push_back(NewSeq(NodeKind::kList, PopMark()));
        break;
      case op::kTuple:
        stack_.push_back(NewSeq(NodeKind::kTuple, PopMark()));
        break;
      case op::kDict: {
        uint32_t id = New(NodeKind::kDict);
        AddItems(id, PopMark(), true);
        stack_.push_back(id);
        break;
      }
      case op::kTuple1:
      case op::kTuple2:
      case op::kTuple3: {
        std::vector<uint32_t> items(op_ - op::kTuple1 + 1);
        for (size_t k = items.size(); k-- > 0;) items[k] = Pop();
        stack_.push_back(NewSeq(NodeKind::kTuple, std::move(items)));
        break;
      }
      case op::kAppend: {
        uint32_t v = Pop();
        AddItems(Top(), {v}, false);
        break;
      }
      case op::kSetItem: {
        uint32_t v = Pop(), k = Pop();
        AddItems(Top(), {k, v}, true);
        break;
      }
      case op::kAppends:
      case op::kSetItems: {
        std::vector<uint32_t> items = PopMark();
        AddItems(Top(), items, op_ == op::kSetItems);
        break;
      }
      case op::kBinPut:
      case op::kLongBinPut:
      case op::kMemoize: {
        uint32_t index = op_ == op::kBinPut       ? *Take(1)
                         : op_ == op::kLongBinPut ? format::LoadU32(Take(4))
                                                  : static_cast<uint32_t>(memo_size_);
        MemoPut(index, Top());
        break;
      }
      case op::kBinGet:
      case op::kLongBinGet: {
        uint32_t index = op_ == op::kBinGet ? *Take(1) : format::LoadU32(Take(4));
        const uint32_t node = MemoGet(index);
        if (node == kNoNode) Fail("memo key " + std::to_string(index) + " was never stored");
        stack_.push_back(node);
        break;
      }
      case op::kGlobal: {
        std::string module = ReadLine();
        std::string name = ReadLine();
        stack_.push_back(LookupGlobal(module, name));
        break;
      }
      case op::kStackGlobal: {
        uint32_t name = Pop(), module = Pop();  // NOLINT(readability-isolate-declaration)
        stack_.push_back(LookupGlobal(Expect(module, NodeKind::kString, "STACK_GLOBAL module").s,
                                      Expect(name, NodeKind::kString, "STACK_GLOBAL name").s));
        break;
      }
      case op::kReduce:
      case op::kNewObj: {
        uint32_t args = Pop(), fn = Pop();
        stack_.push_back(Call(fn, args, op_));
        break;
      }
      case op::kNewObjEx: {
        uint32_t kwargs = Pop(), args = Pop(), cls = Pop();
        Expect(kwargs, NodeKind::kDict, "NEWOBJ_EX kwargs");
        stack_.push_back(Call(cls, args, op_, kwargs));
        break;
      }
      case op::kBuild: {
        // An object's state (kept), or attributes on a dict (an OrderedDict
        // state_dict's _metadata).
        uint32_t state = Pop();
        Node& target = At(Top());
        if (target.kind == NodeKind::kObject) {
          objects_[target.i].ops.emplace_back(op::kBuild, std::vector<uint32_t>{state});
          break;
        }
        Expect(state, NodeKind::kDict, "BUILD state");
        if (target.kind != NodeKind::kDict || target.attrs >= 0) {
          Fail(std::string("BUILD: expected an object or a dict without attributes, found ") +
               KindName(target.kind));
        }
        target.attrs = state;
        break;
      }
      case op::kDup:
        stack_.push_back(Top());
        break;
      case op::kEmptySet: {
        uint32_t args = New(NodeKind::kTuple);
        stack_.push_back(NewObject(Builtin("set"), args, op::kReduce));
        break;
      }
      case op::kAddItems: {
        std::vector<uint32_t> items = PopMark();
        uint32_t target = Top();
        if (At(target).kind != NodeKind::kObject) Fail("ADDITEMS: expected a set");
        objects_[At(target).i].ops.emplace_back(op::kAddItems, std::move(items));
        break;
      }
      case op::kFrozenSet: {  // frozenset([items...])
        uint32_t list = NewSeq(NodeKind::kList, PopMark());
        uint32_t args = NewSeq(NodeKind::kTuple, {list});
        stack_.push_back(NewObject(Builtin("frozenset"), args, op::kReduce));
        break;
      }
      case op::kByteArray8: {  // bytearray(b"...")
        const uint64_t n = format::LoadU64(Take(8));
        const uint8_t* p = Take(n);
        uint32_t bytes = New(NodeKind::kBytes);
        At(bytes).s.assign(reinterpret_cast<const char*>(p), n);
        uint32_t args = NewSeq(NodeKind::kTuple, {bytes});
        stack_.push_back(NewObject(Builtin("bytearray"), args, op::kReduce));
        break;
      }
      case op::kNextBuffer:
      case op::kReadOnlyBuffer:
      case op::kExt1:
      case op::kExt2:
      case op::kExt4:
        throw Error(ErrorCode::kUnsupported, path_, op_offset_,
                    "pickle: out-of-band buffers and the copyreg extension registry are not "
                    "supported (torch.save does not write them)");
      case op::kBinPersId:
        stack_.push_back(LoadStorage(Pop()));
        break;
      case op::kStop: {
        if (stack_.size() != 1 || !marks_.empty()) {
          Fail("STOP: expected one object and no open MARK, found " +
               std::to_string(stack_.size()) + " objects and " + std::to_string(marks_.size()) +
               " marks");
        }
        if (pos_ != size_)
          Fail("STOP: expected the end of data, found " + std::to_string(size_ - pos_) +
               " more bytes");
        Result result;
        converted_.assign(nodes_.size(), false);
        typed_.assign(nodes_.size(), false);
        result.root = Convert(stack_[0], 0);
        result.storages = std::move(storages_);
        return result;
      }
      default: {
        char label[48];
        std::snprintf(label, sizeof label, "unknown opcode 0x%02x", op_);
        Fail(label);
      }
    }
  }
}

void Machine::MemoPut(uint32_t index, uint32_t node) {
  // Dense while the keys come nearly in order, and never more than twice the
  // keys stored (plus a page): a key far ahead goes to the map, so neither
  // one LONG_BINPUT 4000000000 nor keys spaced widely can cost more memory
  // than the pickle's own bytes.
  if (index < memo_dense_.size() ||
      (index < memo_dense_.size() + 4096 && index < 2 * memo_size_ + 4096)) {
    if (index >= memo_dense_.size()) memo_dense_.resize(index + 1, kNoNode);
    if (memo_dense_[index] == kNoNode && memo_sparse_.erase(index) == 0) ++memo_size_;
    memo_dense_[index] = node;
  } else {
    memo_size_ += memo_sparse_.insert_or_assign(index, node).second;
  }
}

uint32_t Machine::MemoGet(uint32_t index) const {
  if (index < memo_dense_.size() && memo_dense_[index] != kNoNode) return memo_dense_[index];
  const auto it = memo_sparse_.find(index);
  return it == memo_sparse_.end() ? kNoNode : it->second;
}

}  // namespace detail

const Value* Value::Find(std::string_view key) const {
  for (size_t k = 0; k < keys.size(); ++k) {
    if (keys[k] == key && key_values[k].kind == Kind::kString) return &items[k];
  }
  for (size_t k = 0; k < keys.size(); ++k) {
    if (keys[k] == key && key_values[k].kind == Kind::kInt) return &items[k];
  }
  return nullptr;
}

const Value* Value::Attribute(std::string_view name) const {
  return attributes ? attributes->Find(name) : nullptr;
}

Result Parse(const uint8_t* data, size_t size, const std::string& path) {
  detail::Machine machine(data, size, path);
  return machine.Run();
}

}  // namespace tsar::pickle
