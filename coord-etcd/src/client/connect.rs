//! Connecting: the client, its TLS settings, and the probe that tells the
//! server's minimum lease TTL.

use std::time::Duration;

use coord_core::util::bounded;
use coord_core::{Error, Result};
use etcd_client::{Client, ConnectOptions, LeaseGrantResponse};

use crate::client::keys::{BACKEND, map_err};
use crate::options::EtcdOptions;

/// Connect to the cluster named by `opts`, logging in if a user is given,
/// and grant one 1 s lease (the probe: its TTL is the server's minimum).
/// The caller revokes the probe's lease.
pub(crate) async fn connect(opts: &EtcdOptions) -> Result<(Client, LeaseGrantResponse)> {
    let scheme = if opts.tls { "https://" } else { "http://" };
    let endpoints: Vec<String> = opts.hosts.iter().map(|h| format!("{scheme}{h}")).collect();
    let mut co = ConnectOptions::new()
        .with_connect_timeout(opts.connect_timeout)
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
        .with_keep_alive_while_idle(true)
        .with_require_leader(true)
        .with_auto_token_refresh(true);
    if opts.tls {
        co = co.with_tls(tls_options(opts)?);
    }
    if let Some((user, password)) = &opts.user {
        co = co.with_user(user.clone(), password.expose().to_string());
    }
    let limit = opts.call_timeout + opts.connect_timeout;
    let client = bounded(BACKEND, "connect", limit, async {
        Client::connect(endpoints.clone(), Some(co))
            .await
            .map_err(|e| map_err("connect", e))
    })
    .await?;
    // Asking for a 1 s lease tells the server's minimum. The channel
    // balances over every endpoint and connects to each lazily, so the
    // first call can land on a member that is down (refused), or on a
    // cluster between leaders: while the connect deadline allows, it
    // is tried again (the probe's lease is short and revoked, so a
    // retry of one that was applied leaves nothing for long).
    let grant = bounded(BACKEND, "connect", limit, async {
        let mut tries = 0u32;
        loop {
            match client.lease_client().grant(1, None).await {
                Ok(g) => return Ok(g),
                Err(e) => {
                    let e = map_err("connect", e);
                    if tries >= 40 || !matches!(e, Error::Unavailable { .. }) {
                        return Err(e);
                    }
                    tries += 1;
                    tracing::debug!(error = %e, "etcd connect probe failed; trying again");
                    tokio::time::sleep(Duration::from_millis(10 * u64::from(tries.min(10)))).await;
                }
            }
        }
    })
    .await?;
    Ok((client, grant))
}

fn tls_options(opts: &EtcdOptions) -> Result<etcd_client::TlsOptions> {
    let mut tls = etcd_client::TlsOptions::new();
    match &opts.ca_file {
        Some(ca) => {
            let pem = std::fs::read(ca)
                .map_err(|e| Error::Config(format!("cannot read CA file {}: {e}", ca.display())))?;
            tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
        }
        None => tls = tls.with_native_roots(),
    }
    if let Some((cert, key)) = &opts.identity {
        let c = std::fs::read(cert).map_err(|e| {
            Error::Config(format!("cannot read certificate {}: {e}", cert.display()))
        })?;
        let k = std::fs::read(key)
            .map_err(|e| Error::Config(format!("cannot read key file {}: {e}", key.display())))?;
        tls = tls.identity(etcd_client::Identity::from_pem(c, k));
    }
    if let Some(d) = &opts.domain {
        tls = tls.domain_name(d.clone());
    }
    Ok(tls)
}
