// Letting go of the GIL where C++ joins threads that may need it.
#pragma once

#include <Python.h>

namespace fairring {

// Releases the GIL for its lifetime if this thread holds it (Python dropped
// the last reference to a process group, so its backend is destroyed under
// the GIL): the engines' destructors join threads that may be waiting for it
// (future callbacks, the last reference to a tensor held from Python).  Not
// while the interpreter finalizes, when a released GIL cannot safely be
// taken back; the exit quiesce (_quiesce_all) has stopped those threads'
// use of Python by then.
class GilReleaseIfHeld {
 public:
  GilReleaseIfHeld() {
    if (Py_IsInitialized() && !finalizing() && PyGILState_Check()) saved_ = PyEval_SaveThread();
  }
  ~GilReleaseIfHeld() {
    if (saved_) PyEval_RestoreThread(saved_);
  }
  GilReleaseIfHeld(const GilReleaseIfHeld&) = delete;
  GilReleaseIfHeld& operator=(const GilReleaseIfHeld&) = delete;

 private:
  static bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
  }
  PyThreadState* saved_ = nullptr;
};

}  // namespace fairring
