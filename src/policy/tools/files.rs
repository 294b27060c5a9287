//! The tools that move files in and out of machines. A read holds one page in memory, whatever
//! the file's size: the download is read up to the page and paused there, and the next page of
//! the same read (the same offset the last one ended at) continues it rather than downloading
//! the file again.

use super::ToolError;
use super::args::{self, Encoding};
use super::call::parts::{Cancel, Fleets, Ownership, Waits};
use super::results;
use crate::fleet::FileReader;
use crate::policy::output::utf8_prefix_len;
use crate::policy::progress::Progress;
use crate::policy::reads::ParkedRead;
use crate::policy::reads::ParkedReads;
use crate::process::config::Config;
use crate::process::credentials::Supplier;
use crate::process::redaction::Ending;
use crate::process::workspaces::Workspaces;
use base64::Engine as _;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument as _;

/// How much of the next page is downloaded while a page travels to the client.
const READ_AHEAD: usize = 4 * 1024 * 1024;

/// What read-file takes of the call: the machine brought up, the read parked between pages,
/// its bytes redacted; with `changes`, the workspace read back.
type Reading<'c> = (
    Ownership<'c>,
    Fleets<'c>,
    Waits<'c>,
    Cancel<'c>,
    &'c Config,
    &'c Supplier,
    &'c ParkedReads,
    (&'c Arc<Workspaces>, &'c Progress),
);

pub(super) async fn read_file(
    (machines, fleets, waits, cancel, config, credentials, reads, (workspaces, progress)): Reading<
        '_,
    >,
    a: args::ReadFileArgs,
) -> Result<results::FileRead, ToolError> {
    let named = machines.machine(&a.name)?;
    if a.length == Some(0) {
        return Err(ToolError::argument(
            "length",
            "give at least 1, or leave it out to read to the end",
        ));
    }
    let budget = config.max_output_bytes;
    // The page is held whole in memory on its way out: a length past the budget would have the
    // server buffer whatever the caller names (2^53 buffered a whole 1 GiB file).
    if let Some(length) = a.length.filter(|&l| l > budget as u64) {
        return Err(ToolError::argument(
            "length",
            format!(
                "{length} is over the {budget} bytes one page may hold (this server's output \
                 budget): give at most {budget}, and read on from the offset after it"
            ),
        ));
    }
    if a.changes == Some(true) {
        let parts = (
            machines,
            fleets,
            waits,
            config,
            workspaces,
            (progress, cancel),
        );
        return super::workspace::read_changes(parts, a).await;
    }
    // Left out, the encoding is utf8, but a whole file read that turns out to be an image
    // comes as an image content block instead: the model sees it, where base64 or mangled
    // text would be noise to it.
    let image_wanted = a.encoding.is_none() && a.length.is_none() && a.offset.unwrap_or(0) == 0;
    let encoding = a.encoding.unwrap_or_default();
    // Base64 grows by a third: by default a page's encoded content stays within the budget.
    let page_max = match encoding {
        Encoding::Utf8 => budget,
        Encoding::Base64 => budget / 4 * 3,
    };
    let fleet = fleets.reach(a.target).await?;
    let started_machine = waits.ensure_running(&fleet, &named).await?;
    let want = a
        .length
        .map_or(page_max, |l| usize::try_from(l).unwrap_or(page_max));
    let offset = a.offset.unwrap_or(0);
    let kind = fleet.kind();
    // A credential value crossing either edge of the page is replaced whole (and the page's
    // end moved past it): the page is read with a value's length less one on each side.
    let redactor = credentials.redactor();
    let reach = redactor.longest().saturating_sub(1);
    let (shared, behind) = match reads.take(kind, &named, &a.path, offset) {
        Some(parked) => parked,
        None => {
            let stream = cancel.run(fleet.read_file(&named, &a.path)).await?;
            let mut reader = FileReader::new(stream);
            let before = offset.saturating_sub(reach as u64);
            cancel.run(reader.skip_to(before)).await?;
            let behind_len = usize::try_from(offset - reader.position().min(offset)).unwrap_or(0);
            cancel.run(reader.peek(behind_len)).await?;
            let behind = reader.take(behind_len).to_vec();
            (Arc::new(tokio::sync::Mutex::new(reader)), behind)
        }
    };
    // A read-ahead still under way finishes first: it is on the way to this page.
    let mut reader = shared.lock().await;
    if image_wanted && reader.position() == 0 {
        let head = cancel.run(reader.peek(IMAGE_SIGNATURE_BYTES)).await?;
        if let Some(image) = ImageType::of(head) {
            let parts = (cancel, config, credentials);
            return read_image(parts, &mut reader, a.path.into(), image, started_machine).await;
        }
    }
    let start = reader.position();
    // Three bytes past the page tell whether its end splits a character.
    let asked = want.saturating_add(3).saturating_add(reach);
    let at_hand = cancel.run(reader.peek(asked)).await?;
    let mut len = want.min(at_hand.len());
    if encoding == Encoding::Utf8 && len < at_hand.len() {
        // Never split a character across pages; the next page starts where this one ends.
        len = utf8_prefix_len(at_hand, len).max(1.min(len));
    }
    let (len, shown) = if redactor.is_empty() {
        (len, at_hand[..len].to_vec())
    } else {
        // Fewer bytes than asked for: the file ends within them.
        let ending = if at_hand.len() < asked {
            Ending::Final
        } else {
            Ending::Continues
        };
        let mut around = behind.clone();
        around.extend_from_slice(&at_hand[..at_hand.len().min(asked)]);
        let window = behind.len()..behind.len() + len;
        let mut page = redactor.window(&around, window.clone(), ending);
        if page.end <= behind.len() && len > 0 {
            // All of it held back as a value's possible start (it cannot be, with a value's
            // length at hand past the page, but a read must never stall): replaced instead.
            page = redactor.window(&around, window, Ending::Final);
        }
        (page.end.saturating_sub(behind.len()), page.bytes)
    };
    let mut behind = behind;
    behind.extend_from_slice(&reader.take(len));
    let behind = behind.split_off(behind.len().saturating_sub(reach));
    let size = cancel.run(reader.size()).await?;
    let eof = start + len as u64 >= size;
    if !eof && reader.can_continue() {
        drop(reader);
        reads.park(ParkedRead {
            kind,
            machine: named.to_string(),
            path: a.path.to_string(),
            offset: start + len as u64,
            reader: shared.clone(),
            behind,
            parked_at: Instant::now(),
        });
        // While this page travels to the client, the next one downloads: a constant's worth,
        // so a read still holds a page plus READ_AHEAD at most.
        tokio::spawn(
            async move {
                let _ = shared.lock().await.peek(READ_AHEAD).await;
            }
            .in_current_span(),
        );
    }
    let content = match encoding {
        Encoding::Utf8 => String::from_utf8_lossy(&shown).into_owned(),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD.encode(&shown),
    };
    Ok(results::FileRead {
        path: a.path.into(),
        content,
        mime_type: None,
        encoding: match encoding {
            Encoding::Utf8 => "utf8".into(),
            Encoding::Base64 => "base64".into(),
        },
        size,
        offset: start,
        bytes: len as u64,
        eof,
        started_machine,
        changes: None,
    })
}

/// The longest signature `ImageType::of` reads (WebP's: "RIFF", a length, "WEBP").
const IMAGE_SIGNATURE_BYTES: usize = 12;

/// The image formats models take as image content, recognised by their first bytes (never by
/// the file's name, which the guest chooses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ImageType {
    Png,
    Jpeg,
    Gif,
    Webp,
}

impl ImageType {
    fn of(head: &[u8]) -> Option<ImageType> {
        if head.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(ImageType::Png)
        } else if head.starts_with(b"\xff\xd8\xff") {
            Some(ImageType::Jpeg)
        } else if head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a") {
            Some(ImageType::Gif)
        } else if head.len() >= IMAGE_SIGNATURE_BYTES
            && head.starts_with(b"RIFF")
            && &head[8..12] == b"WEBP"
        {
            Some(ImageType::Webp)
        } else {
            None
        }
    }

    fn mime_type(self) -> &'static str {
        match self {
            ImageType::Png => "image/png",
            ImageType::Jpeg => "image/jpeg",
            ImageType::Gif => "image/gif",
            ImageType::Webp => "image/webp",
        }
    }
}

/// A whole image as one image content block, within `maxImageBytes`: held whole (a page of
/// an image would not show), refused past the bound with its size and the ways to read it.
async fn read_image(
    (cancel, config, credentials): (Cancel<'_>, &Config, &Supplier),
    reader: &mut FileReader,
    path: String,
    image: ImageType,
    started_machine: bool,
) -> Result<results::FileRead, ToolError> {
    let bound = config.max_image_bytes;
    let at_hand = cancel.run(reader.peek(bound.saturating_add(1))).await?;
    if at_hand.len() > bound {
        let size = cancel.run(reader.size()).await?;
        return Err(ToolError::argument(
            "encoding",
            format!(
                "{path} is an {} of {size} bytes, over the {bound} bytes this server sends as an \
                 image (maxImageBytes): give encoding \"base64\" to read its bytes a page at a \
                 time, or make a smaller copy in the machine and read that",
                image.mime_type()
            ),
        ));
    }
    // A credential value inside the bytes is replaced like anywhere else: an image that
    // no longer decodes is better than a value that leaves.
    let redactor = credentials.redactor();
    let whole = at_hand.len();
    let bytes = redactor.window(at_hand, 0..whole, Ending::Final).bytes;
    Ok(results::FileRead {
        path,
        content: base64::engine::general_purpose::STANDARD.encode(&bytes),
        mime_type: Some(image.mime_type().into()),
        encoding: "image".into(),
        size: whole as u64,
        offset: 0,
        bytes: whole as u64,
        eof: true,
        started_machine,
        changes: None,
    })
}

pub(super) async fn write_file(
    (machines, fleets, waits, cancel): (Ownership<'_>, Fleets<'_>, Waits<'_>, Cancel<'_>),
    a: args::WriteFileArgs,
) -> Result<results::FileWritten, ToolError> {
    let named = machines.machine(&a.name)?;
    let bytes = match a.encoding {
        Encoding::Utf8 => a.content.into_bytes(),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(a.content.trim())
            .map_err(|e| ToolError::argument("content", format!("not valid base64 ({e})")))?,
    };
    let fleet = fleets.reach(a.target).await?;
    if let Some(why) = fleet.upload_refusal(bytes.len() as u64) {
        return Err(ToolError::argument("content", why));
    }
    // A file written before the workload's container is up lands under a mount that then
    // hides it; a command that has run means the container is up.
    let started_machine = waits.ensure_running(&fleet, &named).await?;
    if !started_machine {
        waits.wait_ready(&fleet, &named).await?;
    }
    let size = cancel.run(fleet.write_file(&named, &a.path, bytes)).await?;
    Ok(results::FileWritten {
        path: a.path.into(),
        size,
        started_machine,
    })
}

#[cfg(test)]
mod tests {
    use super::ImageType;

    #[test]
    fn images_are_recognised_by_their_first_bytes_only() {
        let cases: [(&[u8], Option<ImageType>); 9] = [
            (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", Some(ImageType::Png)),
            (b"\xff\xd8\xff\xe0\0\x10JFIF\0", Some(ImageType::Jpeg)),
            (b"GIF89a\x01\0\x01\0\x80\0", Some(ImageType::Gif)),
            (b"GIF87a\x01\0\x01\0\x80\0", Some(ImageType::Gif)),
            (b"RIFF\x24\0\0\0WEBPVP8 ", Some(ImageType::Webp)),
            // A WAV file is RIFF too, and a PNG's name on text is text.
            (b"RIFF\x24\0\0\0WAVEfmt ", None),
            (b"\x89PNG but text", None),
            (b"RIFF\x24\0", None),
            (b"", None),
        ];
        for (head, expected) in cases {
            assert_eq!(ImageType::of(head), expected, "{head:?}");
        }
    }
}
