//! `keel-sandbox-launcher`: the sandbox launcher `keel` runs for each confined shell command
//! (`keel-sandbox-launcher __sandbox 1`, the spec on its standard input; see
//! `keel_tools::sandbox`). It holds nothing but the launcher, so it starts in a fraction of the
//! time the full `keel` binary takes; `keel` uses itself (`keel __sandbox 1`) when this file is
//! not installed beside it.

fn main() {
    keel_tools::sandbox::run_launcher_if_requested();
    eprintln!(
        "keel-sandbox-launcher: the sandbox launcher, started by keel for each confined shell \
         command; it is not a command"
    );
    std::process::exit(2);
}
