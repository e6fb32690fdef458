// The restricted pickle machine's output (writer/pickle_machine.h): the object
// graph copied into the tree that writer/pickle.h hands out, and objects
// written back as pickle opcodes (writer/pickler.h).
#include <algorithm>
#include <cstring>
#include <iterator>
#include <string_view>

#include "writer/pickler.h"
#include "writer/pickle_machine.h"

namespace tsar::pickle::detail {

void Machine::Charge(uint64_t bytes) {
  shared_bytes_ += bytes;
  if (shared_bytes_ > kMaxSharedBytes) {
    Fail("result tree: expected at most " + std::to_string(kMaxSharedBytes) +
         " bytes of repeated shared objects, found more (objects shared too often)");
  }
}


// Copies the object graph into a tree. Shared objects are copied at each use,
// so the budget and the depth cap stop exponential sharing and cycles.
Value Machine::Convert(uint32_t id, size_t depth) {
  const Node& n = At(id);
  if (depth > kMaxDepth)
    Fail("nesting: expected at most " + std::to_string(kMaxDepth) + " levels (or a cycle)");
  // A first copy costs no more than the input that built the node did; later
  // copies of shared objects are what can explode, so only they are charged.
  const bool repeat = converted_[id];
  converted_[id] = true;
  if (repeat) Charge(sizeof(Value) + n.s.size() + n.items.size() * sizeof(Value));
  Value v;
  switch (n.kind) {
    case NodeKind::kNone:
      v.kind = Value::Kind::kNone;
      break;
    case NodeKind::kBool:
      v.kind = Value::Kind::kBool;
      v.b = n.i != 0;
      break;
    case NodeKind::kInt:
      v.kind = Value::Kind::kInt;
      v.i = n.i;
      break;
    case NodeKind::kFloat:
      v.kind = Value::Kind::kFloat;
      v.f = n.f;
      break;
    case NodeKind::kString:
      v.kind = Value::Kind::kString;
      v.str = n.s;
      break;
    case NodeKind::kBytes:
      v.kind = Value::Kind::kBytes;
      v.str = n.s;
      break;
    case NodeKind::kTensor:
      v.kind = Value::Kind::kTensor;
      v.tensor = tensors_[n.i];
      if (repeat) Charge(16 * v.tensor.sizes.size());
      break;
    case NodeKind::kList:
    case NodeKind::kTuple:
      v.kind = n.kind == NodeKind::kList ? Value::Kind::kList : Value::Kind::kTuple;
      for (uint32_t item : n.items) v.items.push_back(Convert(item, depth + 1));
      break;
    case NodeKind::kDict: {
      v.kind = Value::Kind::kDict;
      v.ordered = n.ordered;
      // A repeated str or int key keeps its first position and takes the
      // last value, as in Python. Other keys are kept as they come.
      std::unordered_map<std::string, size_t> position;
      for (size_t k = 0; k + 1 < n.items.size(); k += 2) {
        const Node& key = At(n.items[k]);
        const bool plain = key.kind == NodeKind::kInt || key.kind == NodeKind::kString;
        std::string text = key.kind == NodeKind::kInt      ? std::to_string(key.i)
                           : key.kind == NodeKind::kString ? key.s
                                                           : std::string();
        if (repeat) Charge(text.size());
        auto [it, inserted] =
            plain
                ? position.emplace((key.kind == NodeKind::kInt ? "i" : "s") + text, v.items.size())
                : std::make_pair(position.end(), true);
        Value item = Convert(n.items[k + 1], depth + 1);
        if (inserted) {
          v.keys.push_back(std::move(text));
          v.key_values.push_back(Convert(n.items[k], depth + 1));
          v.items.push_back(std::move(item));
        } else {
          v.items[it->second] = std::move(item);
        }
      }
      if (n.attrs >= 0)
        v.attributes = std::make_shared<Value>(Convert(static_cast<uint32_t>(n.attrs), depth + 1));
      break;
    }
    case NodeKind::kBigInt:
      v.kind = Value::Kind::kBigInt;
      v.str = n.s;
      break;
    case NodeKind::kGlobal:
    case NodeKind::kObject: {
      v.kind = Value::Kind::kOpaque;
      v.str = Label(id);
      Fragment f;
      Pickle(id, depth + 1, f);
      v.segments = std::move(f.segments);
      v.items = std::move(f.items);
      if (n.kind == NodeKind::kObject) TorchaoGroup(id, v);
      break;
    }
    case NodeKind::kStorage:
      throw Error(ErrorCode::kUnsupported, path_, std::nullopt,
                  "pickle: a storage used outside a plain tensor (a quantized, sparse or other "
                  "special tensor, or a bare storage) is not supported");
  }
  return v;
}

// What an opaque value is, for people: the global, or the class an object
// was made from ("argparse.Namespace", "numpy.core.multiarray.scalar").
std::string Machine::Label(uint32_t id) {
  const Node& n = At(id);
  if (n.kind == NodeKind::kGlobal) return GlobalName(n);
  const Object& o = objects_[n.i];
  const Node& c = At(o.callable);
  if (c.kind != NodeKind::kGlobal) return "object";
  const std::string name = GlobalName(c);
  const Node& args = At(o.args);
  // copyreg's helpers name the class in their first argument.
  if ((name == "copyreg._reconstructor" || name == "copy_reg._reconstructor" ||
       name == "copyreg.__newobj__") &&
      args.kind == NodeKind::kTuple && !args.items.empty() &&
      At(args.items[0]).kind == NodeKind::kGlobal) {
    return GlobalName(At(args.items[0]));
  }
  return name;
}

// Writes node `id` as pickle opcodes that rebuild it (writer/pickler.h; the
// protocol 4 ADDITEMS and NEWOBJ_EX as the input had them), without memo: a
// shared object is written at each use. A tensor is not written: it ends the
// current segment and becomes an item of `f`.
void Machine::Pickle(uint32_t id, size_t depth, Fragment& f) {
  if (depth > kMaxDepth)
    Fail("nesting: expected at most " + std::to_string(kMaxDepth) + " levels (or a cycle)");
  const bool repeat = converted_[id];
  converted_[id] = true;
  const Node& n = At(id);
  if (repeat) Charge(sizeof(Node) + n.s.size() + n.items.size() * 4);
  // The segment being written: a tensor inside any child starts a new one.
  const auto out = [&f] { return Pickler(&f.segments.back()); };
  const auto items = [&](const std::vector<uint32_t>& v) {
    for (uint32_t item : v) Pickle(item, depth + 1, f);
  };
  switch (n.kind) {
    case NodeKind::kNone:
      out().None();
      break;
    case NodeKind::kBool:
      out().Bool(n.i != 0);
      break;
    case NodeKind::kInt:
      out().Int(n.i);
      break;
    case NodeKind::kBigInt:
      out().BigInt(n.s);
      break;
    case NodeKind::kFloat:
      out().Float(n.f);
      break;
    case NodeKind::kString:
      out().Str(n.s);
      break;
    case NodeKind::kBytes:
      out().Bytes(n.s);
      break;
    case NodeKind::kList:
      out().EmptyList();
      if (!n.items.empty()) {
        out().Mark();
        items(n.items);
        out().Appends();
      }
      break;
    case NodeKind::kTuple:
      out().Mark();
      items(n.items);
      out().Tuple();
      break;
    case NodeKind::kDict:
      if (n.ordered) {
        out().OrderedDict();
      } else {
        out().EmptyDict();
      }
      if (!n.items.empty()) {
        out().Mark();
        items(n.items);
        out().SetItems();
      }
      if (n.attrs >= 0) {
        Pickle(static_cast<uint32_t>(n.attrs), depth + 1, f);
        out().Build();
      }
      break;
    case NodeKind::kGlobal: {
      const size_t nl = n.s.find('\n');  // "module\nname"
      out().Global(n.s.substr(0, nl), n.s.substr(nl + 1));
      break;
    }
    case NodeKind::kObject: {
      const Object& o = objects_[n.i];  // Pickle adds no object: the reference stays valid
      Pickle(o.callable, depth + 1, f);
      Pickle(o.args, depth + 1, f);
      if (o.kwargs >= 0) Pickle(static_cast<uint32_t>(o.kwargs), depth + 1, f);
      out().Op(o.how);
      for (const auto& [opcode, operands] : o.ops) {
        if (opcode != op::kBuild) out().Mark();
        items(operands);
        out().Op(opcode);
      }
      break;
    }
    case NodeKind::kTensor: {
      Value t;
      t.kind = Value::Kind::kTensor;
      t.tensor = tensors_[n.i];
      f.items.push_back(std::move(t));
      f.segments.emplace_back();
      break;
    }
    case NodeKind::kStorage:
      throw Error(ErrorCode::kUnsupported, path_, std::nullopt,
                  "pickle: a storage used outside a plain tensor (a quantized, sparse or other "
                  "special tensor, or a bare storage) is not supported");
  }
}
}  // namespace tsar::pickle::detail
