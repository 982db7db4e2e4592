// fork(): which process an object was made in. A pthread_atfork handler counts, in each
// child, the forks the process descends from; an object that records the count when it is
// made tells with one atomic load whether it now runs in a forked child, where the threads
// it started do not exist and its sockets are shared with the parent.
#pragma once

#include <cstdint>

namespace stockade::detail {

// The number of fork() calls between the first use of this function and now, on the
// path from the process that made that first call to this one.
std::uint64_t fork_generation() noexcept;

}  // namespace stockade::detail
