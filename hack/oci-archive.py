#!/usr/bin/env python3
"""Packs a directory as a one-layer OCI image archive (an `oci-layout` tar: `ctr images import`, `docker load -i`,
`podman load -i`), reproducibly: files sorted, owner 0, mtime 0, gzip without a timestamp.

    oci-archive.py ROOTFS OUT.tar --name docker.io/library/cso:latest [--user 65532:65532]
                   [--entrypoint '["/usr/local/bin/cso"]'] [--cmd '["run"]'] [--env K=V ...]

The image is named in the index with both `org.opencontainers.image.ref.name` and `io.containerd.image.name`;
give a fully qualified name (`docker.io/library/...`, `registry.k8s.io/...`): containerd's CRI plugin does not
find an image imported under a short name. Prints the archive's path and sizes.
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import tarfile


def layer_of(rootfs):
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for base, dirs, files in sorted(os.walk(rootfs)):
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                path = os.path.join(base, name)
                info = tar.gettarinfo(path, arcname=os.path.relpath(path, rootfs))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                if info.isfile():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return layer.getvalue()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rootfs")
    parser.add_argument("out")
    parser.add_argument("--name", required=True)
    parser.add_argument("--user", default="")
    parser.add_argument("--entrypoint", default="null")
    parser.add_argument("--cmd", default="null")
    parser.add_argument("--env", action="append", default=[])
    args = parser.parse_args()
    if "/" not in args.name.split(":")[0] or "." not in args.name.split("/")[0]:
        parser.error(f"--name {args.name}: give a fully qualified name (registry host first)")

    raw = layer_of(args.rootfs)
    packed = gzip.compress(raw, compresslevel=9, mtime=0)
    blobs = {}

    def blob(data, media):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media, "digest": digest, "size": len(data)}

    config = {"User": args.user, "Env": args.env}
    for key, value in (("Entrypoint", json.loads(args.entrypoint)), ("Cmd", json.loads(args.cmd))):
        if value is not None:
            config[key] = value
    image_config = json.dumps({
        "architecture": "amd64", "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]},
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob(image_config, "application/vnd.oci.image.config.v1+json"),
        "layers": [blob(packed, "application/vnd.oci.image.layer.v1.tar+gzip")],
    }).encode()
    entry = blob(manifest, "application/vnd.oci.image.manifest.v1+json")
    entry["annotations"] = {"org.opencontainers.image.ref.name": args.name, "io.containerd.image.name": args.name}
    index = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                        "manifests": [entry]}).encode()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with tarfile.open(args.out + ".tmp", "w") as tar:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", index)
        for digest, data in blobs.items():
            add("blobs/sha256/" + digest.split(":")[1], data)
    os.replace(args.out + ".tmp", args.out)

    mib = lambda n: f"{n / 1048576:.1f} MiB"
    print(f"image {args.name}: {args.out}")
    print(f"  compressed (pulled) size: {mib(len(packed) + len(image_config) + len(manifest))}")
    print(f"  unpacked size: {mib(len(raw))}")


if __name__ == "__main__":
    main()
