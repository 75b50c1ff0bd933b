// The errors users see, as torch's own types: c10::DistNetworkError when a
// peer was lost (it exited, or its connection closed), c10::DistBackendError
// for any other failed collective (a timeout, a mismatch, an abort).  In
// Python they are torch.distributed.DistNetworkError / DistBackendError, both
// RuntimeErrors, so code written against NCCL or gloo catches them alike.
#pragma once

#include <exception>
#include <string>

namespace fairring {

// Words that every message about a lost peer carries (wait_check.cpp: a
// local peer's process exited; channel.cpp: a rail peer's connection was
// lost).  The kind travels with the text through the node's abort word and
// the rails' abort messages, so every rank raises the same type.
constexpr const char* kPeerExitedMark = ") exited while ";
constexpr const char* kConnectionLostMark = "(did that rank exit or crash?)";

// The exception for a failed op with message `what`.
std::exception_ptr dist_error(const std::string& what);

}  // namespace fairring
