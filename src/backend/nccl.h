// NCCL, loaded at run time (dlopen) for tensor parallelism (-sm row): builds and machines without NCCL are
// unaffected, and a missing or unusable library is a one-line error only when something asks for it.
// Only the calls tensor parallelism needs (communicators for the GPUs of one process, grouped
// all-reduces) are bound; their types are declared here from NCCL's public ABI (an
// opaque communicator, a 128-byte unique id, int enums), so no NCCL header is needed to build.
#pragma once

#include <string>
#include <vector>

namespace roofline::nccl {

using Comm = struct OpaqueComm*;    // ncclComm_t
struct UniqueId {                   // ncclUniqueId
  char internal[128];
};
enum Result : int { kSuccess = 0 };                        // ncclResult_t
enum DataType : int { kFloat16 = 6, kFloat32 = 7, kBfloat16 = 9 };  // ncclDataType_t
enum RedOp : int { kSum = 0 };                            // ncclRedOp_t

// The bound entry points. Streams are cudaStream_t, passed as void* (the same pointer in the C ABI).
struct Api {
  int (*get_version)(int* version) = nullptr;
  int (*get_unique_id)(UniqueId* id) = nullptr;
  int (*comm_init_all)(Comm* comms, int n_devices, const int* devices) = nullptr;
  int (*comm_destroy)(Comm comm) = nullptr;
  int (*all_reduce)(const void* send, void* recv, size_t count, int type, int op, Comm comm, void* stream) = nullptr;
  int (*group_start)() = nullptr;
  int (*group_end)() = nullptr;
  const char* (*error_string)(int result) = nullptr;
  int version = 0;   // NCCL_VERSION_CODE of the loaded library, e.g. 22703 for 2.27.3
  std::string path;  // the file that was loaded
};

// Where the loader looks, in order: ROOFLINE_NCCL_LIB (a file) when set, else libnccl.so.2 and libnccl.so
// through the dynamic loader's search path, then the lib/ folder of the `nvidia-nccl-cu*` Python wheel in
// the usual site-packages and dist-packages folders (and $VIRTUAL_ENV's).
std::vector<std::string> candidate_paths();

// Loads the library at `path` (a file name the dynamic loader resolves, or a path) and binds every entry
// point; fails with one line naming the file and what is missing. Each call loads again (tests).
Api load(const std::string& path);

// The process's NCCL: the first candidate that loads, bound once; fails with one line listing where it
// looked and why the first candidate failed.
const Api& api();

// Throws a one-line error naming `what` when `result` is not success.
void check(const Api& nccl, int result, const char* what);

}  // namespace roofline::nccl
