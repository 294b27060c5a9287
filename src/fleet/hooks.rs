//! Every request the server sends to an engine or the cloud, traced: the generated clients'
//! hook (progenitor's `ClientHooks`, implemented here for both raw clients) and the few requests
//! built by hand (the cloud's file and exec-stream routes). Each is one `debug` event inside the
//! span of the tool call that made it, so that `SMOL_MCP_LOG=debug` ties a slow engine request
//! to its call. Only the operation, the method, the status and the time are written: never a
//! header (the cloud's bearer token travels in one), a body or a query.

use crate::generated::{smolcloud, smolvm};
use progenitor_client::{ClientHooks, ClientInfo, OperationInfo};
use std::time::Instant;

/// Sends `request` and records how it went under `operation`.
pub(crate) async fn traced(
    operation: &'static str,
    fleet: &'static str,
    client: &reqwest::Client,
    request: reqwest::Request,
) -> reqwest::Result<reqwest::Response> {
    let method = request.method().clone();
    let sent = Instant::now();
    let result = client.execute(request).await;
    // To the microsecond: the benches subtract these from a call's time to find the server's
    // own, which is a millisecond or less.
    let millis = sent.elapsed().as_micros() as f64 / 1000.0;
    match &result {
        Ok(response) => tracing::debug!(
            fleet,
            operation,
            %method,
            status = response.status().as_u16(),
            millis,
            "upstream request"
        ),
        Err(e) => {
            // reqwest names the URL in its errors; the address alone is enough here.
            let error = match e.url() {
                Some(url) => e.to_string().replace(url.as_str(), "<url>"),
                None => e.to_string(),
            };
            tracing::debug!(
                fleet,
                operation,
                %method,
                %error,
                millis,
                "upstream request failed"
            )
        }
    }
    result
}

/// A request built by hand (not through a generated client), traced like theirs.
pub(crate) async fn send_traced(
    operation: &'static str,
    fleet: &'static str,
    request: reqwest::RequestBuilder,
) -> reqwest::Result<reqwest::Response> {
    let (client, request) = request.build_split();
    traced(operation, fleet, &client, request?).await
}

// An impl for the client itself wins over the generated one for `&Client` (method resolution
// takes the by-value receiver first), so every generated operation comes through here.

impl ClientHooks<()> for smolvm::Client {
    async fn exec(
        &self,
        request: reqwest::Request,
        info: &OperationInfo,
    ) -> reqwest::Result<reqwest::Response> {
        traced(info.operation_id, "local", self.client(), request).await
    }
}

impl ClientHooks<()> for smolcloud::Client {
    async fn exec(
        &self,
        request: reqwest::Request,
        info: &OperationInfo,
    ) -> reqwest::Result<reqwest::Response> {
        traced(info.operation_id, "cloud", self.client(), request).await
    }
}
