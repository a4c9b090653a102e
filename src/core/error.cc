#include "core/error.h"

namespace myriad {

const char* class_name(ErrorClass c) {
  switch (c) {
    case ErrorClass::kInternal: return "internal error";
    case ErrorClass::kInput: return "input error";
    case ErrorClass::kRuntime: return "runtime fault";
    case ErrorClass::kComm: return "communication fault";
    case ErrorClass::kNumerics: return "numerics fault";
    case ErrorClass::kPreempted: return "preempted";
  }
  return "error";
}

ErrorClass class_from_name(const std::string& name) {
  for (ErrorClass c : {ErrorClass::kInternal, ErrorClass::kInput, ErrorClass::kRuntime, ErrorClass::kComm,
                       ErrorClass::kNumerics, ErrorClass::kPreempted})
    if (name == class_name(c)) return c;
  return ErrorClass::kRuntime;
}

}  // namespace myriad
