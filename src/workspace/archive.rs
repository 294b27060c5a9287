//! A copy's files as one gzip'd tar for a machine, and a machine's tar read back into a copy.
//!
//! The archive coming back was written by the machine, so it is read as hostile input: no entry
//! lands outside the destination (the `tar` crate's `unpack_in` refuses `..`, absolute names
//! and writing through a symlink it unpacked), only files, directories and symlinks are made
//! (a device node or a FIFO in a host directory would be read by git), modes lose their
//! set-id bits, owners are not restored, and the bytes read are bounded before they are
//! decompressed further. Through a library rather than the host's `tar`: GNU tar, BSD tar and
//! busybox differ on exactly these points.

use super::error::{WorkspaceError, io};
use super::room::Room;
use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use std::io::Read;
use std::path::{Component, Path};

/// The copy's files (its `.git` included), as a gzip'd tar of paths relative to it.
pub fn pack(tree: &Path) -> Result<Vec<u8>, WorkspaceError> {
    let what = format!("packing {}", tree.display());
    let mut builder = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::fast()));
    builder.follow_symlinks(false);
    builder
        .append_dir_all(".", tree)
        .map_err(io(what.clone()))?;
    builder
        .into_inner()
        .and_then(GzEncoder::finish)
        .map_err(io(what))
}

/// What an unpack made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unpacked {
    pub files: u64,
    pub bytes: u64,
    /// Entries that are neither file, directory nor symlink (devices, FIFOs), or a `.git`,
    /// named and not made.
    pub skipped: Vec<String>,
}

/// Reads at most `limit` bytes, then fails.
struct Bounded<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.left = self.left.checked_sub(n as u64).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::FileTooLarge, "over the bound")
        })?;
        Ok(n)
    }
}

/// Unpacks a gzip'd tar a machine wrote into `into` (which must not exist yet), refusing one
/// whose unpacked tar is over `max_bytes`, and each entry before it is written when `room`
/// has not its size.
pub fn unpack(
    archive: impl Read,
    into: &Path,
    max_bytes: u64,
    room: &dyn Room,
) -> Result<Unpacked, WorkspaceError> {
    std::fs::create_dir_all(into).map_err(io(format!("creating {}", into.display())))?;
    let what = "reading the machine's workspace archive";
    let mut reader = tar::Archive::new(Bounded {
        inner: GzDecoder::new(archive),
        left: max_bytes,
    });
    reader.set_preserve_permissions(false);
    reader.set_preserve_ownerships(false);
    reader.set_unpack_xattrs(false);
    reader.set_overwrite(true);
    let over = |e: &std::io::Error| {
        e.kind() == std::io::ErrorKind::FileTooLarge
            || e.get_ref()
                .is_some_and(|inner| inner.to_string().contains("over the bound"))
    };
    let too_large = || WorkspaceError::ArchiveTooLarge { limit: max_bytes };
    let mut made = Unpacked::default();
    let entries = reader.entries().map_err(io(what))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| if over(&e) { too_large() } else { io(what)(e) })?;
        let path = entry
            .path()
            .map_err(io(what))?
            .components()
            .filter(|c| !matches!(c, Component::CurDir))
            .collect::<std::path::PathBuf>();
        let shown = path.display().to_string();
        if shown.is_empty() {
            continue;
        }
        let kind = entry.header().entry_type();
        let in_git = path
            .components()
            .next()
            .is_some_and(|c| c.as_os_str() == ".git");
        if in_git || !(kind.is_file() || kind.is_dir() || kind.is_symlink() || kind.is_hard_link())
        {
            made.skipped.push(shown);
            continue;
        }
        let size = entry.header().size().unwrap_or(0);
        let link = entry.link_name_bytes().map_or(0, |name| name.len() as u64);
        room.take(size.max(link))?;
        let inside = entry.unpack_in(into).map_err(|e| {
            if over(&e) {
                too_large()
            } else {
                WorkspaceError::Io {
                    what: format!("unpacking {shown} from the machine's workspace"),
                    why: e.to_string(),
                }
            }
        })?;
        if !inside {
            return Err(WorkspaceError::UnsafeArchive { path: shown });
        }
        if kind.is_file() {
            made.files += 1;
            made.bytes = made.bytes.saturating_add(size);
        }
    }
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive_of(build: impl FnOnce(&mut tar::Builder<GzEncoder<Vec<u8>>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(GzEncoder::new(Vec::new(), Compression::fast()));
        build(&mut b);
        b.into_inner().unwrap().finish().unwrap()
    }

    fn file(b: &mut tar::Builder<GzEncoder<Vec<u8>>>, name: &str, body: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o4755);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, body).unwrap();
    }

    #[test]
    fn a_packed_tree_unpacks_as_it_was() {
        let tmp = tempfile::tempdir().unwrap();
        let tree = tmp.path().join("tree");
        std::fs::create_dir_all(tree.join("src")).unwrap();
        std::fs::write(tree.join("src/a.txt"), "a").unwrap();
        std::os::unix::fs::symlink("src/a.txt", tree.join("link")).unwrap();
        let packed = pack(&tree).unwrap();
        let out = tmp.path().join("out");
        let made = unpack(
            packed.as_slice(),
            &out,
            1 << 20,
            &super::super::room::Unbounded,
        )
        .unwrap();
        assert_eq!((made.files, made.bytes), (1, 1));
        assert_eq!(std::fs::read_to_string(out.join("src/a.txt")).unwrap(), "a");
        assert_eq!(
            std::fs::read_link(out.join("link")).unwrap(),
            Path::new("src/a.txt")
        );
    }

    #[test]
    fn a_machines_archive_cannot_reach_outside_or_make_devices() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        // A symlink out of the destination, then a file written through it.
        let evil = archive_of(|b| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            b.append_link(&mut h, "out", tmp.path()).unwrap();
            file(b, "out/planted", b"x");
        });
        let err = unpack(
            evil.as_slice(),
            &tmp.path().join("a"),
            1 << 20,
            &super::super::room::Unbounded,
        )
        .unwrap_err();
        assert!(!tmp.path().join("planted").exists(), "{err}");
        // A device node and a .git are named and skipped; set-id bits are dropped.
        let odd = archive_of(|b| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Block);
            h.set_size(0);
            b.append_data(&mut h, "disk", std::io::empty()).unwrap();
            file(
                b,
                ".git/config",
                b"[core]\n\tfsmonitor = touch /tmp/pwned\n",
            );
            file(b, "run.sh", b"#!/bin/sh\n");
        });
        let made = unpack(
            odd.as_slice(),
            &tmp.path().join("b"),
            1 << 20,
            &super::super::room::Unbounded,
        )
        .unwrap();
        assert_eq!(
            made.skipped,
            vec!["disk".to_owned(), ".git/config".to_owned()]
        );
        assert!(!tmp.path().join("b/disk").exists());
        let mode = std::fs::metadata(tmp.path().join("b/run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7000, 0, "{mode:o}");
        assert_ne!(mode & 0o100, 0, "{mode:o}");
    }

    #[test]
    fn an_archive_over_the_bound_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let big = archive_of(|b| file(b, "zeros", &vec![0u8; 1 << 20]));
        assert!(big.len() < 16 << 10, "compresses well: {}", big.len());
        let err = unpack(
            big.as_slice(),
            &tmp.path().join("c"),
            64 << 10,
            &super::super::room::Unbounded,
        )
        .unwrap_err();
        assert!(
            matches!(err, WorkspaceError::ArchiveTooLarge { .. }),
            "{err}"
        );
    }
}
