//! An rpath to the libqsakv that qsakv-sys found (DEP_QSAKV_LIB_DIR), for this crate's
//! tests and examples, so they run without LD_LIBRARY_PATH.
fn main() {
    if let Ok(dir) = std::env::var("DEP_QSAKV_LIB_DIR") {
        // Tests, examples and binaries of this package only (never dependents).
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
