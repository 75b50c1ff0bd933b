// This process's id without a system call: glibc no longer caches getpid(),
// and Fairring checks it on every collective (a fork()ed child must not use
// its parent's group).  Kept right across fork() by an atfork handler.
#pragma once

#include <sys/types.h>

namespace fairring {

pid_t current_pid();

}  // namespace fairring
