// The core's files as one translation unit: parsing torch's headers is most of a file's compile. Included by
// relative names, unlike Meson's unity files (which name each file by its absolute path): the same sources make the
// same compiler cache entry in any per-user cache.
#include "shimgen_buffers.cpp"
#include "shimgen_core.cpp"
#include "shimgen_package.cpp"
#include "shimgen_safetensors.cpp"
