// SPDX-License-Identifier: Apache-2.0
// Small POSIX file helpers for overlays: bounded whole-file reads with statuses that
// tell "missing" from "unreadable", and staging directories committed by rename(2).
#pragma once

#include <cstdint>
#include <string>

namespace qsakv {

// Reads a regular file whole. A path that does not exist is `missing_status`
// (QSAKV_ERROR_OVERLAY_MISSING for overlay parts, QSAKV_ERROR_IO elsewhere); anything
// else that stops the read (permissions, a directory, a symlink loop) is QSAKV_ERROR_IO;
// a file over max_bytes is QSAKV_ERROR_FORMAT. `what` names the file in messages.
std::string read_file(const std::string& path, uint64_t max_bytes, const char* what,
                      int missing_status);

// Creates or truncates `path` and writes `bytes`, then fsyncs. QSAKV_ERROR_IO on failure.
void write_file(const std::string& path, const std::string& bytes);

enum class PathKind { missing, file, directory, other };
// stat(2) that follows links; a loop or permission error is QSAKV_ERROR_IO.
PathKind path_kind(const std::string& path, const char* what);

// The modes the library's published files and directories get: 0644 and 0755 less the
// process's umask, as write_file's new files get. Staging directories (mkdtemp) and
// temporaries (mkstemp) start private, 0700 / 0600, and are given these before they are
// published, so that a serving process of another user can read what a calibration run
// wrote.
unsigned published_file_mode();
unsigned published_dir_mode();

std::string dir_name(const std::string& path);
std::string join_path(const std::string& dir, const std::string& name);

// A staging directory beside `final_dir` ("<final_dir>.staging-XXXXXX"), removed with its
// contents unless committed. While it is built it holds an owner record (process, host,
// boot); creating one first removes the stale staging directories of the same final_dir
// whose owner process is gone (a writer killed with SIGKILL), and only those.
// commit() renames it onto final_dir without replacing anything that appeared meanwhile.
class StagingDir {
 public:
  explicit StagingDir(const std::string& final_dir);
  ~StagingDir();
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  const std::string& path() const { return path_; }
  void commit();

 private:
  std::string final_;
  std::string path_;
  bool committed_ = false;
};

// Refuses (QSAKV_ERROR_INVALID_ARGUMENT) an output directory that already exists.
void require_absent(const std::string& path, const char* what);

}  // namespace qsakv
