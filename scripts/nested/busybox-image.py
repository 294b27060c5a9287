#!/usr/bin/env python3
"""Builds busybox.tar: a docker-save + OCI-layout archive of Alpine's musl busybox, without a registry.

    busybox-image.py ROOTFS_DIR OUT_TAR

ROOTFS_DIR is an extracted agent rootfs (the engine's own Alpine, from agent-rootfs.tar.zst): it
supplies bin/busybox, lib/ld-musl-x86_64.so.1 and the applet list. Alpine's busybox, not Debian's
busybox-static, because the latter's wget segfaults in a guest.

Every header is fixed (mtime, owner, order, JSON key order) so the archive's bytes, and so the
engine's `local:<sha256>` for it, are the same on every run: a warm engine reuses the staged image
instead of staging it again (about a minute under TCG).
"""
import hashlib
import io
import json
import os
import sys
import tarfile

MTIME = 315532800  # 1980-01-01 UTC, the wheel's own timestamps
REPO_TAG = "smol/busybox:latest"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def header(name, kind, mode, size=0, linkname=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = linkname
    info.mtime = MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def add_file(tar, name, data, mode=0o644):
    tar.addfile(header(name, tarfile.REGTYPE, mode, len(data)), io.BytesIO(data))


def layer_bytes(rootfs):
    with open(os.path.join(rootfs, "bin/busybox"), "rb") as f:
        busybox = f.read()
    with open(os.path.join(rootfs, "lib/ld-musl-x86_64.so.1"), "rb") as f:
        musl = f.read()
    listing = os.path.join(rootfs, "etc/busybox-paths.d/busybox")
    with open(listing) as f:
        applets = sorted({line.strip() for line in f if line.strip()} - {"bin/busybox"})

    dirs = {"bin", "dev", "etc", "lib", "proc", "root", "run", "sbin", "sys", "tmp", "usr",
            "usr/bin", "usr/sbin", "usr/local", "usr/local/bin", "var", "var/tmp"}
    for applet in applets:
        parent = os.path.dirname(applet)
        while parent:
            dirs.add(parent)
            parent = os.path.dirname(parent)

    files = {
        "etc/passwd": b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n",
        "etc/group": b"root:x:0:root\nnobody:x:65534:\n",
        "etc/hosts": b"127.0.0.1\tlocalhost localhost.localdomain\n::1\t\tlocalhost localhost.localdomain\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for d in sorted(dirs):
            mode = {"tmp": 0o1777, "var/tmp": 0o1777, "root": 0o700}.get(d, 0o755)
            tar.addfile(header(d + "/", tarfile.DIRTYPE, mode))
        add_file(tar, "bin/busybox", busybox, 0o755)
        add_file(tar, "lib/ld-musl-x86_64.so.1", musl, 0o755)
        # busybox is linked against this name; Alpine keeps it as a symlink to the loader.
        tar.addfile(header("lib/libc.musl-x86_64.so.1", tarfile.SYMTYPE, 0o777,
                           linkname="ld-musl-x86_64.so.1"))
        for name, data in sorted(files.items()):
            add_file(tar, name, data)
        for applet in applets:
            tar.addfile(header(applet, tarfile.SYMTYPE, 0o777, linkname="/bin/busybox"))
    return buf.getvalue()


def js(obj):
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def main():
    rootfs, out = sys.argv[1], sys.argv[2]
    layer = layer_bytes(rootfs)
    layer_digest = hashlib.sha256(layer).hexdigest()
    config = js({
        "architecture": "amd64",
        "os": "linux",
        "created": "1980-01-01T00:00:00Z",
        "config": {"Env": ["PATH=" + PATH], "Cmd": ["/bin/sh"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + layer_digest]},
        "history": [{"created": "1980-01-01T00:00:00Z",
                     "created_by": "scripts/nested/busybox-image.py (Alpine busybox from the agent rootfs)"}],
    })
    config_digest = hashlib.sha256(config).hexdigest()
    manifest = js({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": "sha256:" + config_digest, "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": "sha256:" + layer_digest, "size": len(layer)}],
    })
    manifest_digest = hashlib.sha256(manifest).hexdigest()
    index = js({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": "sha256:" + manifest_digest, "size": len(manifest),
                       "annotations": {"io.containerd.image.name": "docker.io/" + REPO_TAG,
                                       "org.opencontainers.image.ref.name": "latest"}}],
    })
    docker_manifest = js([{"Config": "blobs/sha256/" + config_digest,
                           "RepoTags": [REPO_TAG],
                           "Layers": ["blobs/sha256/" + layer_digest]}])

    tmp = out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        add_file(tar, "oci-layout", js({"imageLayoutVersion": "1.0.0"}))
        add_file(tar, "index.json", index)
        add_file(tar, "manifest.json", docker_manifest)
        tar.addfile(header("blobs/", tarfile.DIRTYPE, 0o755))
        tar.addfile(header("blobs/sha256/", tarfile.DIRTYPE, 0o755))
        for digest, data in sorted([(layer_digest, layer), (config_digest, config),
                                    (manifest_digest, manifest)]):
            add_file(tar, "blobs/sha256/" + digest, data)
    os.utime(tmp, (MTIME, MTIME))
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
