// Package sigpolicy enforces a containers-policy.json(5) file when an image is
// pulled, verifying cosign-style ("sigstore") signatures with public keys.
//
// The file format and its evaluation follow containers/image (the library behind
// podman and CRI-O), so that one policy.json means the same thing to crisp as to
// those tools; where crisp cannot honour an entry it refuses the file at Load
// rather than accept it silently.
//
// Supported:
//
//   - "default" (required, a non-empty list) and "transports"."docker" with its
//     scopes: "" (the transport default), host[:port], host[:port]/namespace…,
//     host[:port]/repository, repository:tag, repository@digest and *.domain
//     wildcards (subdomains only). The most specific scope wins, in
//     containers/image's order: the image itself, the repository, its namespaces
//     from the longest, the host, the wildcards from the longest, the transport
//     default, the global default. Names are matched in their fully expanded form
//     (docker.io/library/busybox, not busybox); a name without tag or digest
//     means its latest tag, and one with both is taken by its digest.
//   - Requirements insecureAcceptAnything, reject and sigstoreSigned with
//     keyPath, keyPaths, keyData or keyDatas (PEM public keys: ECDSA P-256,
//     P-384, P-521, RSA of at least 2048 bits, Ed25519). All requirements of a
//     list must be satisfied.
//   - signedIdentity matchRepoDigestOrExact (the default), matchExact,
//     matchRepository, exactReference, exactRepository and remapIdentity, with
//     containers/image's rules. Note that `cosign sign` by default signs the
//     repository name only (no tag); containers/image, and so crisp, accept such
//     signatures only with matchRepository or exactRepository.
//   - Signatures stored as cosign stores them: the sha256-<hex>.sig tag of the
//     signed digest, and OCI 1.1 referrers of artifact type
//     application/vnd.dev.cosign.artifact.sig.v1+json (through the Referrers API
//     or its sha256-<hex> fallback tag). Each is a "simple signing" payload
//     layer carrying its base64 signature in the dev.cosignproject.cosign/signature
//     annotation; one valid signature suffices.
//
// Not supported, refused at Load with an error naming the entry:
//
//   - signedBy (GPG "simple signing" signatures) and signedBaseLayer;
//   - sigstoreSigned with fulcio, pki or rekorPublicKey* (keyless Fulcio/Rekor and
//     X.509 verification).
//
// Not supported and not looked for: sigstore bundles (v0.3, as written by cosign
// 3's new bundle format) stored as referrers, and attestations.
//
// Transports other than "docker" (docker-daemon, oci, dir, containers-storage…)
// do not apply to a CRI pull: their sections are checked for shape and known
// requirement types, then ignored.
//
// Keys are read at Load: a changed key file takes effect when the policy is
// loaded again.
package sigpolicy
