// python/src/common.h.
#include "python/src/common.h"

#include <exception>

#include "tsar/error.h"

namespace py = pybind11;

namespace tsar::python {
namespace {

// A message names C++'s way to do something (B1 of spec §6.7 names tsar's
// search list, "a reader with another one names its own"): from Python, name
// Python's.
std::string ForPython(std::string message) {
  static const struct {
    const char* cpp;
    const char* python;
  } kSpellings[] = {
      {"OpenOptions::base_dirs", "tsar.open(path, base_dirs=[...])"},
  };
  for (const auto& s : kSpellings) {
    const size_t at = message.find(s.cpp);
    if (at != std::string::npos) message.replace(at, std::string(s.cpp).size(), s.python);
  }
  return message;
}

void RaiseTsarError(const Error& e) {
  py::object cls = py::module_::import("tsar._errors").attr("Error");
  py::object off = e.offset() ? py::object(py::int_(*e.offset())) : py::object(py::none());
  py::object exc = cls(ForPython(e.what()), static_cast<int>(e.code()), e.path(), off);
  PyErr_SetObject(cls.ptr(), exc.ptr());
}

}  // namespace

void RegisterErrorTranslator() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      RaiseTsarError(e);
    }
  });
}

MetadataValue FromPython(const py::handle& v, const std::string& key) {
  if (py::isinstance<py::bytes>(v)) return Bytes{v.cast<std::string>()};
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  if (py::isinstance<py::bool_>(v))
    throw Error(ErrorCode::kInvalidArgument, "", std::nullopt,
                "metadata " + key + ": expected str, int, float or bytes, found bool");
  if (py::isinstance<py::int_>(v)) return v.cast<int64_t>();
  if (py::isinstance<py::float_>(v)) return v.cast<double>();
  throw Error(ErrorCode::kInvalidArgument, "", std::nullopt,
              "metadata " + key + ": expected str, int, float or bytes, found " +
                  std::string(py::str(py::type::of(v).attr("__name__"))));
}

py::object MetadataToPython(const MetadataValue& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return py::str(*s);
  if (const auto* i = std::get_if<int64_t>(&v)) return py::int_(*i);
  if (const auto* d = std::get_if<double>(&v)) return py::float_(*d);
  return py::bytes(std::get<Bytes>(v).data);
}

const char* MapModeName(MapMode mode) {
  switch (mode) {
    case MapMode::kCopyOnWrite:
      return "copy_on_write";
    case MapMode::kRead:
      return "read";
    case MapMode::kShared:
      break;
  }
  return "shared";
}

OpenOptions MakeOpenOptions(int mode, int prefetch, int verify,
                            std::vector<std::string> base_dirs) {
  OpenOptions o;
  o.mode = static_cast<MapMode>(mode);
  o.prefetch = static_cast<Prefetch>(prefetch);
  o.verify = static_cast<VerifyMode>(verify);
  o.base_dirs = std::move(base_dirs);
  return o;
}

PackOptions MakePackOptions(uint32_t alignment, const std::string& dtype, std::string base,
                            bool durable, uint32_t tp,
                            std::vector<std::pair<std::string, int64_t>> shard) {
  PackOptions o;
  o.tp = tp;
  o.shard = std::move(shard);
  o.alignment = alignment;
  o.durable = durable;
  o.base = std::move(base);
  o.dtype = FloatingDtype(dtype);
  return o;
}

std::optional<DType> FloatingDtype(const std::string& name) {
  if (name.empty()) return std::nullopt;
  const std::optional<DType> d = DTypeFromName(name);
  if (!d) throw Error(ErrorCode::kInvalidArgument, "", std::nullopt, "dtype: unknown " + name);
  return d;
}

}  // namespace tsar::python
