//! A file as the fleets hand it over: a stream of chunks and, when the answer said, the whole
//! length. Neither API reads a byte range, so a page is found by reading up to it; `FileReader`
//! does that holding at most the page asked for plus one chunk, whatever the file's size.

use super::error::{ErrorKind, FleetError, FleetResult};
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use futures::stream::BoxStream;
use std::time::Duration;

/// How long a download may go without delivering a byte before the read fails.
const STALL: Duration = Duration::from_secs(60);

pub struct FileStream {
    /// The whole file's length, from `Content-Length` (both engines send it).
    pub size: Option<u64>,
    pub chunks: BoxStream<'static, FleetResult<Bytes>>,
}

impl std::fmt::Debug for FileStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStream")
            .field("size", &self.size)
            .finish()
    }
}

impl FileStream {
    /// A file that arrived whole (the exec fallback of an old control plane).
    pub fn whole(bytes: Vec<u8>) -> FileStream {
        FileStream {
            size: Some(bytes.len() as u64),
            chunks: futures::stream::once(async move { Ok(Bytes::from(bytes)) }).boxed(),
        }
    }

    /// The body of an HTTP answer, its transport errors named by `context`.
    pub fn from_response(context: String, response: reqwest::Response) -> FileStream {
        FileStream {
            size: response.content_length(),
            chunks: response
                .bytes_stream()
                .map(move |chunk| chunk.map_err(|e| super::upstream::transport(&context, &e)))
                .boxed(),
        }
    }
}

/// Reads a file stream forward: skip to an offset, take a page, and keep the rest for the next
/// page of the same read.
#[derive(Debug)]
pub struct FileReader {
    stream: FileStream,
    /// The offset in the file of `pending[0]`.
    position: u64,
    /// Bytes received and not yet taken.
    pending: BytesMut,
    ended: bool,
    /// A failed download stays failed: a read-ahead that hit the error must not let the next
    /// page mistake the stream's end for the file's.
    failed: Option<FleetError>,
}

impl FileReader {
    pub fn new(stream: FileStream) -> FileReader {
        FileReader {
            stream,
            position: 0,
            pending: BytesMut::new(),
            ended: false,
            failed: None,
        }
    }

    /// Where the next byte taken sits in the file.
    pub fn position(&self) -> u64 {
        self.position
    }

    async fn next_chunk(&mut self) -> FleetResult<bool> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.ended {
            return Ok(false);
        }
        match tokio::time::timeout(STALL, self.stream.chunks.next()).await {
            Ok(Some(Ok(chunk))) => {
                self.pending.extend_from_slice(&chunk);
                Ok(true)
            }
            Ok(Some(Err(e))) => {
                self.failed = Some(e.clone());
                Err(e)
            }
            Ok(None) => {
                self.ended = true;
                Ok(false)
            }
            Err(_) => {
                let e = FleetError::new(
                    ErrorKind::Timeout,
                    "read file",
                    format!("the download delivered nothing for {} s", STALL.as_secs()),
                );
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Discards everything before `offset` (or up to the end, if the file is shorter).
    pub async fn skip_to(&mut self, offset: u64) -> FleetResult<()> {
        while self.position < offset {
            if self.pending.is_empty() && !self.next_chunk().await? {
                return Ok(());
            }
            let n = usize::try_from(offset - self.position)
                .unwrap_or(usize::MAX)
                .min(self.pending.len());
            let _ = self.pending.split_to(n);
            self.position += n as u64;
        }
        Ok(())
    }

    /// The bytes at hand from the current position, at least `n` of them unless the file ends
    /// first. Nothing is taken.
    pub async fn peek(&mut self, n: usize) -> FleetResult<&[u8]> {
        while self.pending.len() < n && self.next_chunk().await? {}
        Ok(&self.pending[..])
    }

    /// Takes `n` bytes (fewer only at the end of the file); call `peek` first.
    pub fn take(&mut self, n: usize) -> Bytes {
        let n = n.min(self.pending.len());
        self.position += n as u64;
        self.pending.split_to(n).freeze()
    }

    /// The whole file's length: the declared one, else what is left counted to the end (the
    /// bytes are dropped as they arrive, so this costs time, not memory).
    pub async fn size(&mut self) -> FleetResult<u64> {
        if let Some(size) = self.stream.size {
            return Ok(size);
        }
        let mut total = self.position + self.pending.len() as u64;
        self.pending.clear();
        while self.next_chunk().await? {
            total += self.pending.len() as u64;
            self.pending.clear();
        }
        self.position = total;
        self.stream.size = Some(total);
        Ok(total)
    }

    /// Whether reading on from here can continue: the stream is not exhausted or drained.
    pub fn can_continue(&self) -> bool {
        !self.ended || !self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(parts: &[&'static [u8]], declared: Option<u64>) -> FileReader {
        let chunks: Vec<FleetResult<Bytes>> =
            parts.iter().map(|p| Ok(Bytes::from_static(p))).collect();
        FileReader::new(FileStream {
            size: declared,
            chunks: futures::stream::iter(chunks).boxed(),
        })
    }

    #[tokio::test]
    async fn pages_across_chunk_boundaries() {
        let mut r = chunked(&[b"abc", b"defg", b"hij"], Some(10));
        r.skip_to(2).await.unwrap();
        assert_eq!(r.peek(4).await.unwrap(), b"cdefg");
        assert_eq!(&r.take(4)[..], b"cdef");
        assert_eq!(r.position(), 6);
        assert_eq!(r.peek(10).await.unwrap(), b"ghij");
        assert_eq!(&r.take(10)[..], b"ghij");
        assert!(!r.can_continue());
        assert_eq!(r.size().await.unwrap(), 10);
    }

    #[tokio::test]
    async fn an_undeclared_size_is_counted_and_a_short_file_skips_to_its_end() {
        let mut r = chunked(&[b"abc", b"de"], None);
        r.skip_to(1).await.unwrap();
        assert_eq!(r.size().await.unwrap(), 5);
        let mut short = chunked(&[b"ab"], None);
        short.skip_to(9).await.unwrap();
        assert_eq!(short.position(), 2);
        assert!(short.peek(1).await.unwrap().is_empty());
    }
}
