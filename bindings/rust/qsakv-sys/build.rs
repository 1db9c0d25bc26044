//! Finds libqsakv to link against, in this order, and says what it tried when it cannot:
//!   1. $QSAKV_LIB_DIR (a directory holding libqsakv.so) or $QSAKV_LIBRARY (the .so);
//!   2. pkg-config (`qsakv.pc` of an installed libqsakv; $PKG_CONFIG_PATH is honoured);
//!   3. a CMake build tree: $QSAKV_BUILD_DIR, else <repo>/build and <repo>/build-cpu
//!      when this crate sits in its repository (bindings/rust/qsakv-sys).
//! The directory found is passed on to dependent crates as DEP_QSAKV_LIB_DIR (the
//! `qsakv` crate uses it for an rpath so its tests and examples run without
//! LD_LIBRARY_PATH).
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn has_lib(dir: &Path) -> bool {
    dir.join("libqsakv.so").exists() || dir.join("libqsakv.dylib").exists()
}

fn from_env(tried: &mut Vec<String>) -> Option<PathBuf> {
    if let Some(dir) = env::var_os("QSAKV_LIB_DIR") {
        let dir = PathBuf::from(dir);
        if has_lib(&dir) {
            return Some(dir);
        }
        tried.push(format!("$QSAKV_LIB_DIR={}: no libqsakv.so there", dir.display()));
    } else {
        tried.push("$QSAKV_LIB_DIR: not set".into());
    }
    if let Some(lib) = env::var_os("QSAKV_LIBRARY") {
        let lib = PathBuf::from(lib);
        match lib.parent() {
            Some(dir) if lib.exists() && has_lib(dir) => return Some(dir.to_path_buf()),
            _ => tried.push(format!(
                "$QSAKV_LIBRARY={}: missing, or no libqsakv.so link next to it",
                lib.display()
            )),
        }
    } else {
        tried.push("$QSAKV_LIBRARY: not set".into());
    }
    None
}

fn from_pkg_config(tried: &mut Vec<String>) -> Option<PathBuf> {
    let pc = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".into());
    match Command::new(&pc).args(["--variable=libdir", "qsakv"]).output() {
        Ok(out) if out.status.success() => {
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if has_lib(&dir) {
                return Some(dir);
            }
            tried.push(format!("pkg-config: libdir {} has no libqsakv.so", dir.display()));
        }
        Ok(out) => tried.push(format!(
            "{pc} --variable=libdir qsakv: no qsakv.pc on its search path ({}) {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => tried.push(format!("{pc}: {e}")),
    }
    None
}

fn from_build_tree(tried: &mut Vec<String>) -> Option<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = env::var_os("QSAKV_BUILD_DIR") {
        dirs.push(PathBuf::from(d));
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    if let Some(repo) = manifest.ancestors().nth(3) {
        if repo.join("CMakeLists.txt").exists() && repo.join("include/qsakv.h").exists() {
            dirs.push(repo.join("build"));
            dirs.push(repo.join("build-cpu"));
        }
    }
    if dirs.is_empty() {
        tried.push("CMake build tree: $QSAKV_BUILD_DIR not set, and this crate is not inside \
                    the libqsakv repository".into());
    }
    for d in dirs {
        if has_lib(&d) {
            return Some(d);
        }
        tried.push(format!("CMake build tree {}: no libqsakv.so", d.display()));
    }
    None
}

fn main() {
    for var in ["QSAKV_LIB_DIR", "QSAKV_LIBRARY", "QSAKV_BUILD_DIR", "PKG_CONFIG_PATH", "PKG_CONFIG"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    let mut tried = Vec::new();
    let dir = from_env(&mut tried)
        .or_else(|| from_pkg_config(&mut tried))
        .or_else(|| from_build_tree(&mut tried));
    let dir = match dir {
        Some(dir) => dir,
        None => panic!(
            "qsakv-sys: cannot find libqsakv. Tried:\n  {}\nBuild it (cmake -S . -B build && \
             cmake --build build), install it (cmake --install build; pkg-config then finds \
             it), or set QSAKV_LIB_DIR to the directory holding libqsakv.so.",
            tried.join("\n  ")
        ),
    };
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=qsakv");
    // This crate's own test binaries run against the library found.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    // DEP_QSAKV_LIB_DIR for dependents.
    println!("cargo:lib_dir={}", dir.display());
}
