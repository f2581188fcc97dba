// Read first by real.sh when it compiles the adapter against a real PyTorch's headers: from here
// on, a declaration without an export macro (C10_API, TORCH_API, TORCH_CUDA_CPP_API, ... expand to
// default visibility) is hidden, as its definition is in PyTorch's libraries (built with
// -fvisibility=hidden), so the object's reference to it is STV_HIDDEN and exports.py --hidden
// names it. Only visibility changes: the code compiled is the same.
#pragma GCC visibility push(hidden)
