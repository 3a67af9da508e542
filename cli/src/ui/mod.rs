//! `coord ui`: a web dashboard of what is held under a prefix, served on
//! 127.0.0.1 by default. The page (`page.html`, one file with its script
//! and style inline) polls the JSON API:
//!
//! - `GET /api/held?prefix=P[&kind=K][&limit=N]`: the JSON of `coord ls
//!   --json` (one code path: [`crate::ls::listing`]);
//! - `GET /api/dead?queue=NAME[&limit=N]`: the oldest dead letters, as
//!   `coord queue peek --dead --json` shows them (payloads over
//!   [`api::PEEK_PAYLOAD`] bytes cut);
//! - `GET /api/info`: the store, the default prefix, whether actions are on;
//! - `POST /api/action`: force release, redrive, purge; off unless the
//!   server was started with a token, and then only with that token.
//!
//! Every request is bounded ([`api::REQUEST_TIMEOUT`], and the store's
//! call timeout for each call within it), and so is every connection
//! ([`serve::HEADER_TIMEOUT`] to send headers, [`serve::WRITE_TIMEOUT`]
//! for an answer to make progress, [`serve::LIFETIME`] in all, and then
//! [`serve::LAST_REQUEST`]). SIGINT and SIGTERM stop it: the listener
//! closes, requests under way get [`serve::DRAIN`] to finish.

mod action;
mod api;
mod auth;
mod serve;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Args;
use coord::{Coord, Error};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::signal::unix::SignalKind;

use auth::Token;

/// `coord ui`'s arguments.
#[derive(Args, Debug)]
pub struct Ui {
    /// The address to serve on. The default is this machine only; with
    /// port 0 the system picks a free port. The address served on is the
    /// first line of standard output (http://ADDR/).
    #[arg(long, default_value = "127.0.0.1:7878")]
    listen: SocketAddr,
    /// A name (or IP address) requests may give in their Host header,
    /// besides localhost, 127.0.0.1, [::1] and the --listen address: e.g.
    /// the name a TLS proxy that keeps the Host is reached by. Any port.
    /// Repeat for more names. Other names are refused (403), so that a
    /// page of another site cannot read the dashboard (DNS rebinding).
    #[arg(long = "allow-host", value_name = "NAME")]
    allow_host: Vec<String>,
    /// The prefix the page shows at first (it can be changed on the page).
    #[arg(long, default_value = "")]
    prefix: String,
    /// A file holding the token that turns on the actions (force release,
    /// redrive, purge): at least 16 printable ASCII characters, no spaces
    /// (e.g. `head -c 24 /dev/urandom | base64 > token`). The token may
    /// instead be given in the COORD_UI_TOKEN environment variable.
    /// Without either, the dashboard is read-only.
    #[arg(long)]
    token_file: Option<PathBuf>,
}

/// `coord ui`: serve the dashboard until SIGINT or SIGTERM (exit 0).
/// Exit 64 for a bad token, prefix, --allow-host or an address it cannot
/// listen on.
pub async fn ui(coord: Coord, args: Ui) -> Result<ExitCode, Error> {
    let token = auth::load(args.token_file.as_deref())?;
    let hosts = auth::Hosts::new(args.listen.ip(), &args.allow_host)?;
    if !args.prefix.is_empty() {
        coord::validate::name("--prefix", &args.prefix)?;
    }
    // Signal handlers first: a SIGTERM right after the address is printed
    // stops the server cleanly.
    let mut interrupt = serve::handler(SignalKind::interrupt())?;
    let mut terminate = serve::handler(SignalKind::terminate())?;
    let listener = TcpListener::bind(args.listen).await.map_err(|e| {
        Error::Config(format!(
            "cannot listen on {}: {e}; pick another --listen address or port",
            args.listen
        ))
    })?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::Config(format!("cannot read the address listened on: {e}")))?;
    println!("http://{addr}/");
    let actions = if token.is_some() {
        "on, with the token"
    } else {
        "off (no token)"
    };
    eprintln!(
        "coord ui: serving what is held under {:?} on http://{addr}/; actions {actions}",
        args.prefix
    );
    if !addr.ip().is_loopback() {
        eprintln!(
            "coord ui: warning: {addr} can be reached from other machines, over plain HTTP \
             (no TLS): anyone who can reach it sees the names held, and the token travels \
             unencrypted. Use --listen 127.0.0.1:PORT and an SSH tunnel or a TLS proxy instead \
             (with --allow-host NAME for the name the proxy is reached by)"
        );
    }
    let state = Dashboard {
        store: coord.capabilities().backend,
        coord,
        token,
        prefix: args.prefix,
        hosts,
    };
    let app = router(Arc::new(state));
    let stop = async {
        tokio::select! {
            _ = interrupt.recv() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        }
    };
    serve::serve(listener, app, stop).await;
    Ok(ExitCode::SUCCESS)
}

/// What every request of one dashboard shares.
pub struct Dashboard {
    /// The store's handle.
    pub coord: Coord,
    /// The token the actions need; `None`: actions are off.
    pub token: Option<Token>,
    /// The prefix the page shows at first, and `/api/held`'s default.
    pub prefix: String,
    /// The names requests may give in `Host`.
    pub hosts: auth::Hosts,
    /// The store's backend name (`redis`, `postgres`, ...).
    pub store: &'static str,
}

/// The dashboard's routes, every request bounded by [`api::REQUEST_TIMEOUT`].
pub fn router(dashboard: Arc<Dashboard>) -> Router {
    Router::new()
        .route("/", get(api::page))
        .route("/api/info", get(api::info))
        .route("/api/held", get(api::held))
        .route("/api/dead", get(api::dead))
        .route("/api/action", post(action::action))
        .fallback(api::not_found)
        .method_not_allowed_fallback(api::method_not_allowed)
        .layer(middleware::from_fn_with_state(
            dashboard.clone(),
            api::guard,
        ))
        .layer(DefaultBodyLimit::max(action::MAX_BODY))
        .with_state(dashboard)
}

/// A refused or failed request: its status and what to say.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    /// A refusal with `status`, saying `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    /// A bad request (400), saying `message`.
    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = reply(self.status, &json!({"error": self.message}));
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        let status = match &e {
            Error::InvalidArgument { .. } | Error::Config(_) => StatusCode::BAD_REQUEST,
            Error::Unsupported { .. } => StatusCode::NOT_IMPLEMENTED,
            Error::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Error::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let message = match status {
            StatusCode::BAD_REQUEST => format!("{e}; nothing was changed"),
            StatusCode::INTERNAL_SERVER_ERROR => {
                format!("{e}; retry, and if it persists, report it with this message")
            }
            _ => e.to_string(),
        };
        ApiError::new(status, message)
    }
}

/// `v` as a JSON answer.
pub fn reply(status: StatusCode, v: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}
