use clap::Parser;

/// mimalloc rather than glibc's malloc: see the workspace Cargo.toml.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    use std::io::IsTerminal as _;
    // Colour only for a person at a terminal, and never under NO_COLOR.
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TXSTORE_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_ansi(colour)
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = txstore::cli::main(txstore::cli::Cli::parse()) {
        // A reader that went away (`scan | head`) is not an error.
        let closed_pipe = e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .or_else(|| c.downcast_ref::<txstore::Error>()?.io_error())
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        });
        if closed_pipe {
            return;
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
