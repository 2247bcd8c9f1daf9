//! The `keel` binary: parses arguments and hands off to [`keel_cli::cli::run`].

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = keel_cli::cli::Cli::parse();
    let verbose = cli.global.verbose;
    keel_cli::logging::init(cli.global.log_format);
    match keel_cli::cli::run(cli) {
        Ok(code) => code,
        // `keel sessions events S | head -1`: the reader has what it wanted.
        Err(error) if keel_cli::report::is_broken_pipe(&error) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            if verbose {
                eprintln!("keel: {error:?}");
            } else {
                eprintln!("keel: {}", keel_cli::report::describe(&error));
            }
            std::process::ExitCode::FAILURE
        }
    }
}
