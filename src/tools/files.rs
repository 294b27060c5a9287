//! The tools that move files in and out of machines.

use super::args::{self, Encoding};
use super::output::utf8_prefix_len;
use super::results;
use super::{Call, ToolError};
use crate::backend::CachedFile;
use crate::fleet::Fleet;
use base64::Engine as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the pages of one read-file may come from the copy its first page fetched.
const PAGE_CACHE_SECS: u64 = 30;
/// Files larger than this are fetched again for every page rather than kept in memory.
const PAGE_CACHE_MAX_BYTES: usize = 256 * 1024 * 1024;

pub(super) async fn read_file(
    call: &Call<'_>,
    a: args::ReadFileArgs,
) -> Result<results::FileRead, ToolError> {
    args::machine_ref("name", &a.name)?;
    args::absolute_path("path", &a.path)?;
    if a.length == Some(0) {
        return Err(ToolError::argument(
            "length",
            "give at least 1, or leave it out to read to the end",
        ));
    }
    let fleet = call.fleet(a.target).await?;
    let started_machine = call.is_stopped(&fleet, &a.name).await?;
    if started_machine {
        call.wait_ready(&fleet, &a.name).await?;
    }
    let bytes = file_bytes(call, &fleet, &a.name, &a.path, a.offset.unwrap_or(0) > 0).await?;
    let size = bytes.len() as u64;
    let offset = a.offset.unwrap_or(0).min(size);
    let rest = &bytes[offset as usize..];
    let budget = call.backend.config.max_output_bytes;
    // Base64 grows by a third: a page's encoded content stays within the budget.
    let default_len = match a.encoding {
        Encoding::Utf8 => budget,
        Encoding::Base64 => budget / 4 * 3,
    };
    let mut len = a
        .length
        .map_or(default_len, |l| usize::try_from(l).unwrap_or(usize::MAX))
        .min(rest.len());
    if a.encoding == Encoding::Utf8 && len < rest.len() {
        // Never split a character across pages; the next page starts where this one ends.
        len = utf8_prefix_len(rest, len).max(1.min(len));
    }
    let page = &rest[..len];
    let content = match a.encoding {
        Encoding::Utf8 => String::from_utf8_lossy(page).into_owned(),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(page),
    };
    Ok(results::FileRead {
        path: a.path,
        content,
        encoding: match a.encoding {
            Encoding::Utf8 => "utf8".into(),
            Encoding::Base64 => "base64".into(),
        },
        size,
        offset,
        bytes: len as u64,
        eof: offset + len as u64 >= size,
        started_machine,
    })
}

/// The whole file (neither API reads a range). A read that continues at an offset reuses
/// the copy the same read fetched, for up to `PAGE_CACHE_SECS`, unless a call that can change
/// a machine came in between; a read from offset 0 always fetches afresh.
async fn file_bytes(
    call: &Call<'_>,
    fleet: &Fleet,
    machine: &str,
    path: &str,
    continuing: bool,
) -> Result<Arc<Vec<u8>>, ToolError> {
    let kind = fleet.kind();
    if continuing
        && let Ok(cache) = call.backend.file_cache.lock()
        && let Some(c) = cache.as_ref()
        && c.kind == kind
        && c.machine == machine
        && c.path == path
        && c.fetched.elapsed() < Duration::from_secs(PAGE_CACHE_SECS)
    {
        return Ok(c.bytes.clone());
    }
    let bytes = Arc::new(call.cancellable(fleet.read_file(machine, path)).await?);
    if bytes.len() <= PAGE_CACHE_MAX_BYTES
        && let Ok(mut cache) = call.backend.file_cache.lock()
    {
        *cache = Some(CachedFile {
            kind,
            machine: machine.to_owned(),
            path: path.to_owned(),
            bytes: bytes.clone(),
            fetched: Instant::now(),
        });
    }
    Ok(bytes)
}

pub(super) async fn write_file(
    call: &Call<'_>,
    a: args::WriteFileArgs,
) -> Result<results::FileWritten, ToolError> {
    args::machine_ref("name", &a.name)?;
    args::absolute_path("path", &a.path)?;
    let bytes = match a.encoding {
        Encoding::Utf8 => a.content.into_bytes(),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(a.content.trim())
            .map_err(|e| ToolError::argument("content", format!("not valid base64 ({e})")))?,
    };
    let fleet = call.fleet(a.target).await?;
    let started_machine = call.is_stopped(&fleet, &a.name).await?;
    // A file written before the workload's container is up lands under a mount that then
    // hides it; a command that has run means the container is up.
    call.wait_ready(&fleet, &a.name).await?;
    let size = call
        .cancellable(fleet.write_file(&a.name, &a.path, bytes))
        .await?;
    Ok(results::FileWritten {
        path: a.path,
        size,
        started_machine,
    })
}
