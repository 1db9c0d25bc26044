// SPDX-License-Identifier: Apache-2.0
#include "core/format/file_io.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.hpp"

namespace qsakv {

namespace {

// Closes a descriptor on every path out of a function.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int remove_entry(const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }

void remove_tree(const std::string& path) {
  // Depth first, not following links: a staging dir holds links into a base checkpoint
  // that must survive.
  ::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

// The owner record a staging directory holds while it is being built: which process on
// which machine (and boot, and PID namespace) made it. Removed just before the rename, so
// a published directory never has it.
constexpr char kStagingOwnerFile[] = ".qsakv-staging-owner";

std::string small_file(const char* path) {
  Fd f{::open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)};
  if (f.fd < 0) return std::string();
  char buf[512];
  const ssize_t n = ::read(f.fd, buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

std::string owner_record(pid_t pid) {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  std::string boot = small_file("/proc/sys/kernel/random/boot_id");
  while (!boot.empty() && (boot.back() == '\n' || boot.back() == ' ')) boot.pop_back();
  char ns[128] = {0};
  const ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
  if (n < 0) ns[0] = 0;
  return format("pid %lld\nhost %s\nboot %s\npidns %s\n", static_cast<long long>(pid), host,
                boot.c_str(), ns);
}

// Removes staging directories beside `final_dir` (named "<final>.staging-XXXXXX") that a
// library process made on this machine, in this boot and PID namespace, and that is gone
// (killed during a write or materialize). Anything else, including directories of a live
// writer, of another user or without an owner record, is left alone. Best effort.
void remove_stale_staging(const std::string& final_dir) {
  const std::string dir = dir_name(final_dir);
  const size_t slash = final_dir.find_last_of('/');
  const std::string prefix =
      (slash == std::string::npos ? final_dir : final_dir.substr(slash + 1)) + ".staging-";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  std::vector<std::string> stale;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() != prefix.size() + 6 || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string path = join_path(dir, name);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid())
      continue;
    const std::string rec = small_file(join_path(path, kStagingOwnerFile).c_str());
    long long pid = 0;
    if (std::sscanf(rec.c_str(), "pid %lld", &pid) != 1 || pid <= 0) continue;
    // Same machine, boot and namespace, or the PID means nothing here.
    if (rec != owner_record(static_cast<pid_t>(pid))) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive
    stale.push_back(path);
  }
  ::closedir(d);
  for (const std::string& p : stale) remove_tree(p);
}

}  // namespace

std::string read_file(const std::string& path, uint64_t max_bytes, const char* what,
                      int missing_status) {
  // O_NONBLOCK: a FIFO standing where a file belongs must not block open(); it is then
  // refused as not a regular file.
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (f.fd < 0) {
    const int err = errno;
    if (err == ENOENT)
      fail(static_cast<qsakv_status>(missing_status), "%s not found: %s", what, path.c_str());
    fail(QSAKV_ERROR_IO, "cannot open %s %s: %s", what, path.c_str(), std::strerror(err));
  }
  struct stat st;
  if (::fstat(f.fd, &st) != 0)
    fail(QSAKV_ERROR_IO, "cannot stat %s %s: %s", what, path.c_str(), std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(QSAKV_ERROR_IO, "%s %s is not a regular file", what, path.c_str());
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    fail(QSAKV_ERROR_FORMAT, "%s %s is %lld bytes; at most %llu are accepted", what, path.c_str(),
         static_cast<long long>(st.st_size), static_cast<unsigned long long>(max_bytes));
  std::string bytes;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      fail(QSAKV_ERROR_IO, "cannot read %s %s: %s", what, path.c_str(), std::strerror(errno));
    if (n == 0) break;
    bytes.append(buf, static_cast<size_t>(n));
    // The file may grow while read: the bound holds for what is read, not just stat.
    if (bytes.size() > max_bytes)
      fail(QSAKV_ERROR_FORMAT, "%s %s grew past %llu bytes while read", what, path.c_str(),
           static_cast<unsigned long long>(max_bytes));
  }
  return bytes;
}

void write_file(const std::string& path, const std::string& bytes) {
  Fd f{::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (f.fd < 0) fail(QSAKV_ERROR_IO, "cannot create %s: %s", path.c_str(), std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(f.fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(QSAKV_ERROR_IO, "cannot write %s: %s", path.c_str(), std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  // The rename that publishes the directory must not expose half-written files.
  if (::fsync(f.fd) != 0)
    fail(QSAKV_ERROR_IO, "cannot sync %s: %s", path.c_str(), std::strerror(errno));
}

PathKind path_kind(const std::string& path, const char* what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return PathKind::missing;
    fail(QSAKV_ERROR_IO, "cannot stat %s %s: %s", what, path.c_str(), std::strerror(errno));
  }
  if (S_ISREG(st.st_mode)) return PathKind::file;
  if (S_ISDIR(st.st_mode)) return PathKind::directory;
  return PathKind::other;
}

std::string dir_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string join_path(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

namespace {
// umask(2) can only be read by setting it, which races with other threads creating files;
// Linux reports it in /proc/self/status ("Umask:\t0022", since 4.7). Without that line the
// common default, 022, is assumed.
unsigned process_umask() {
  FILE* f = std::fopen("/proc/self/status", "re");
  unsigned mask = 022;
  if (!f) return mask;
  char line[256];
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "Umask:", 6) == 0) {
      mask = static_cast<unsigned>(std::strtoul(line + 6, nullptr, 8)) & 0777u;
      break;
    }
  std::fclose(f);
  return mask;
}
}  // namespace

unsigned published_file_mode() { return 0644u & ~process_umask(); }
unsigned published_dir_mode() { return 0755u & ~process_umask(); }

void require_absent(const std::string& path, const char* what) {
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s %s already exists; refusing to overwrite it", what,
         path.c_str());
  if (errno != ENOENT)
    fail(QSAKV_ERROR_IO, "cannot stat %s %s: %s", what, path.c_str(), std::strerror(errno));
}

StagingDir::StagingDir(const std::string& final_dir) : final_(final_dir) {
  std::string t = final_dir;
  while (t.size() > 1 && t.back() == '/') t.pop_back();
  final_ = t;
  remove_stale_staging(t);
  // Beside the target, so that rename(2) stays within one file system.
  std::vector<char> tmpl(t.begin(), t.end());
  const char suffix[] = ".staging-XXXXXX";
  tmpl.insert(tmpl.end(), suffix, suffix + sizeof suffix);
  if (!::mkdtemp(tmpl.data()))
    fail(QSAKV_ERROR_IO, "cannot create a staging directory beside %s: %s", t.c_str(),
         std::strerror(errno));
  path_ = tmpl.data();
  try {
    // Written aside and renamed: a cleaner sees a whole record or none, never a torn one.
    const std::string tmp = join_path(path_, std::string(kStagingOwnerFile) + ".tmp");
    write_file(tmp, owner_record(::getpid()));
    if (::rename(tmp.c_str(), join_path(path_, kStagingOwnerFile).c_str()) != 0)
      fail(QSAKV_ERROR_IO, "cannot create the owner record of %s: %s", path_.c_str(),
           std::strerror(errno));
  } catch (...) {
    remove_tree(path_);
    throw;
  }
}

StagingDir::~StagingDir() {
  if (!committed_) remove_tree(path_);
}

namespace {
// fsync(2) of a directory: makes its entries (the files in it, a rename into it) durable.
// False where the directory cannot be opened or synced; errno says why.
bool sync_directory(const std::string& dir) {
  Fd d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd < 0) return false;
  // Some file systems cannot sync a directory (EINVAL): nothing more can be done there.
  return ::fsync(d.fd) == 0 || errno == EINVAL;
}
}  // namespace

void StagingDir::commit() {
  // The owner record belongs to the staging phase only (a cleaner that finds none leaves
  // the directory alone).
  if (::unlink(join_path(path_, kStagingOwnerFile).c_str()) != 0)
    fail(QSAKV_ERROR_IO, "cannot remove %s/%s: %s", path_.c_str(), kStagingOwnerFile,
         std::strerror(errno));
  // mkdtemp made it 0700: private while it was built, readable as published.
  if (::chmod(path_.c_str(), static_cast<mode_t>(published_dir_mode())) != 0)
    fail(QSAKV_ERROR_IO, "cannot set the mode of %s: %s", path_.c_str(), std::strerror(errno));
  // Its files were synced as written; their names must be durable before the rename
  // publishes them, or a crash could publish a directory without them.
  if (!sync_directory(path_))
    fail(QSAKV_ERROR_IO, "cannot sync %s: %s", path_.c_str(), std::strerror(errno));
  // RENAME_NOREPLACE: a directory created at final_ after our check must not be replaced.
  if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, final_.c_str(), RENAME_NOREPLACE) != 0) {
    const int err = errno;
    if (err == EEXIST)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s appeared while it was being written; left as is",
           final_.c_str());
    // Some file systems lack the flag; plain rename(2) still refuses a non-empty target.
    if ((err != EINVAL && err != ENOSYS) || ::rename(path_.c_str(), final_.c_str()) != 0)
      fail(QSAKV_ERROR_IO, "cannot rename %s to %s: %s", path_.c_str(), final_.c_str(),
           std::strerror(errno));
  }
  committed_ = true;
  // The rename itself made durable. Best effort: the directory is published by now, and
  // failing the call would report as not written what a reader already sees whole (and
  // make a retry refuse, the target existing).
  (void)sync_directory(dir_name(final_));
}

}  // namespace qsakv
