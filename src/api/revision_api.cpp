// extern "C" entry point: the revision (index SHA-256) of a checkpoint.
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <sys/stat.h>

#include "api/guard.hpp"
#include "core/overlay/sha256.hpp"

using namespace qsakv;

extern "C" qsakv_status qsakv_checkpoint_revision(const char* path, char out_hex[65]) {
  return guarded([&] {
    if (!path) fail(QSAKV_ERROR_INVALID_ARGUMENT, "path is NULL");
    if (!out_hex) fail(QSAKV_ERROR_INVALID_ARGUMENT, "out_hex is NULL");
    std::string file = path;
    struct stat st;
    if (::stat(path, &st) != 0) fail(QSAKV_ERROR_IO, "cannot stat %s: %s", path, std::strerror(errno));
    if (S_ISDIR(st.st_mode)) file += "/model.safetensors.index.json";
    std::ifstream in(file, std::ios::binary);
    if (!in) fail(QSAKV_ERROR_IO, "cannot open %s", file.c_str());
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) fail(QSAKV_ERROR_IO, "cannot read %s", file.c_str());
    const std::string hex = sha256_hex(bytes);
    std::memcpy(out_hex, hex.c_str(), 65);
  });
}
