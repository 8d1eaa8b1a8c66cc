//! `moro serve`: the calculator as a local web page, over a small JSON API served by the same
//! binary. Each API call parses its body as the command's own flags and runs the command
//! with its output collected ([`crate::output::captured`]), so the page and the CLI agree to
//! the byte. HTML, CSS, JS and charts are embedded; nothing is loaded from outside.
//!
//! The server is axum 0.8 on tokio; requests run on tokio's blocking pool (an estimate is
//! CPU work), bodies are limited to [`api::MAX_BODY`] bytes, and it binds to 127.0.0.1
//! unless `--host` says otherwise.

mod api;
mod error;
mod page;
mod recent;
mod request;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use crate::error::{user, user_hint};

/// Arguments of `moro serve`.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  moro serve --open\n  moro serve --port 0 --offline   \
                        # a free port, no Hub lookups\n\nThe API is documented in \
                        docs/serve.md. Exit codes: 0 stopped (Ctrl-C), 2 cannot listen."
)]
pub(crate) struct ServeArgs {
    /// Port to listen on; 0 picks a free one (printed on stderr).
    #[arg(long, default_value = "8765")]
    pub(crate) port: u16,
    /// Address to listen on. Anything but loopback exposes the calculator (and the local
    /// files a model path can name) to the network.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub(crate) host: IpAddr,
    /// Open the page in the default browser.
    #[arg(long)]
    pub(crate) open: bool,
    /// Never use the network for models: only local files, the Hugging Face cache and the
    /// catalog, whatever a request says.
    #[arg(long)]
    pub(crate) offline: bool,
}

/// Runs the server until Ctrl-C.
pub(crate) fn run(args: &ServeArgs) -> Result<ExitCode> {
    if args.offline {
        crate::resolve::stay_offline();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| user(format!("cannot start the server: {e}")))?;
    runtime.block_on(serve(args))
}

async fn serve(args: &ServeArgs) -> Result<ExitCode> {
    let addr = SocketAddr::new(args.host, args.port);
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        user_hint(
            format!("cannot listen on {addr}: {e}"),
            "choose another --port, or --port 0 for a free one",
        )
    })?;
    let bound = listener
        .local_addr()
        .map_err(|e| user(format!("cannot listen on {addr}: {e}")))?;
    let url = match bound.ip() {
        ip if ip.is_unspecified() => format!("http://127.0.0.1:{}/", bound.port()),
        _ => format!("http://{bound}/"),
    };
    crate::output::note(&format!("moro serve: listening on {url} (Ctrl-C stops it)"));
    if !bound.ip().is_loopback() {
        crate::output::note(&format!(
            "warning: listening on {}, beyond this machine: anyone who reaches it can use the \
             calculator and name local model files",
            bound.ip()
        ));
    }
    if args.open {
        open_browser(&url);
    }
    let app = api::router(api::State::new(bound.ip().is_loopback()));
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| user(format!("the server stopped: {e}")))?;
    Ok(ExitCode::SUCCESS)
}

/// Opens `url` with the desktop's opener; a failure is a note, the server goes on.
fn open_browser(url: &str) {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else if cfg!(windows) {
        "explorer"
    } else {
        "xdg-open"
    };
    if let Err(e) = std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
    {
        crate::output::note(&format!(
            "note: cannot open a browser ({opener}: {e}); open {url}"
        ));
    }
}
