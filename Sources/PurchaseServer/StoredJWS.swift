import AppStoreCrypto
import AppStoreModels
import Foundation

/// A compact JWS as this server stores it, and back. Apple's JWS headers carry the signing certificate chain: about
/// 4.4 KB of a real 5.3 KB signed transaction, and three times in a notification (the envelope's own, and those of the
/// signed transaction and renewal info its payload carries, Base64url-encoded once more): about 16 KB of 18.5. The chain
/// is the same for every JWS of a signing key, so a stored JWS names each header it knows by its SHA-256, kept once
/// in `jws_headers`, and gives back the same bytes.
///
/// The stored forms (`~` is not a Base64url character, so no compact JWS contains one):
/// - a compact JWS as it came: `H.P.S`;
/// - `~D.P.S`: the header `H` replaced by `D`, its SHA-256 in 64 lowercase hex digits;
/// - `~D.~J.S`: the same, with the payload decoded to its JSON text `J`, in which every carried JWS whose header is
///   known appears as `"~D2.P2.S2"`. Used only when the payload has no `~` of its own, so each `"~` in `J` is one this
///   form put there.
///
/// Every compacted form is expanded before it is chosen and compared with the original: a JWS it would not give back
/// byte for byte is stored with its payload as it came, or whole.
public enum StoredJWS {
    /// `jws` in its stored form: each header that `digest(header)` names replaced, or `jws` itself. `digest` is asked
    /// for the envelope's header and for the header of each compact JWS in `carried` (what its payload carries).
    public static func compact(_ jws: String, carried: [String] = [], digest: (ArraySlice<UInt8>) -> String?) -> String {
        compactNaming(jws, carried: carried, digest: digest).text
    }

    /// `compact`'s text, with the digests it names (the envelope's first, each once; none for a JWS stored as it came).
    /// `decodedPayload`, when the caller has decoded `jws`'s payload already, spares decoding it again: the form made
    /// from it is kept only if it expands to `jws`'s very bytes, as any form is.
    public static func compactNaming(_ jws: String, carried: [String] = [], decodedPayload: [UInt8]? = nil,
                                     digest: (ArraySlice<UInt8>) -> String?) -> (text: String, digests: [String]) {
        let bytes = Array(jws.utf8)[...]
        guard index(of: tilde, in: bytes) == nil, let (first, second) = bytes.withUnsafeBufferPointer({ JWS.dots(in: $0) }),
              let outer = digest(bytes[..<first]), isDigest(outer.utf8) else { return (jws, []) }
        let payload = bytes[(first + 1)..<second], signature = bytes[second...]  // the signature with its dot
        var replacements: [(from: [UInt8], to: [UInt8], digest: String)] = []
        var headers = [outer: bytes[..<first]]
        for nested in carried {
            let nestedBytes = Array(nested.utf8)[...]
            guard let end = index(of: dot, in: nestedBytes), let inner = digest(nestedBytes[..<end]), isDigest(inner.utf8) else { continue }
            let from = [quote] + nestedBytes[..<end] + [dot]
            guard !replacements.contains(where: { $0.from.hasSameBytes(as: from) }) else { continue }
            replacements.append((from, [quote, tilde] + Array(inner.utf8) + [dot], inner))
            headers[inner] = nestedBytes[..<end]
        }
        var form: [UInt8] = []
        form.reserveCapacity(bytes.count)
        form.append(tilde)
        form.append(contentsOf: outer.utf8)
        form.append(dot)
        let outerOnly = { () -> (text: String, digests: [String]) in
            form.append(contentsOf: payload)
            form.append(contentsOf: signature)
            return (String(decoding: form, as: UTF8.self), [outer])
        }
        guard !replacements.isEmpty, let decoded = decodedPayload ?? payload.withUnsafeBufferPointer({ Base64URL.decode($0) }),
              index(of: tilde, in: decoded[...]) == nil else { return outerOnly() }
        var json = decoded, named = [outer], replaced = 0
        for replacement in replacements {
            let count: Int
            (json, count) = replacing(replacement.from, with: replacement.to, in: json)
            replaced += count
            if count > 0, !named.contains(replacement.digest) { named.append(replacement.digest) }
        }
        guard replaced > 0 else { return outerOnly() }
        let prefix = form.count
        form.append(tilde)
        form.append(contentsOf: json)
        form.append(contentsOf: signature)
        // Kept only if it gives back the very bytes.
        guard let parts = Parts(form[...]), let expanded = expand(parts, header: { headers[$0].map { String(decoding: $0, as: UTF8.self) } }),
              expanded.hasSameBytes(as: bytes) else {
            form.removeSubrange(prefix...)
            return outerOnly()
        }
        // A payload that is not UTF-8 (JSON parsers may let such strings through) cannot be text: it keeps its Base64url.
        guard let text = String(validating: form, as: UTF8.self) else {
            form.removeSubrange(prefix...)
            return outerOnly()
        }
        return (text, named)
    }

    /// The compact JWS a stored form stands for; nil when it names a header `header` does not know, or is not a form
    /// `compact` writes. A text that does not begin with `~` is returned as it is.
    public static func expand(_ stored: String, header: (String) -> String?) -> String? {
        guard stored.utf8.first == tilde else { return stored }
        guard let parts = Parts(Array(stored.utf8)[...]), let bytes = expand(parts, header: header) else { return nil }
        return String(decoding: bytes, as: UTF8.self)
    }

    private static func expand(_ parts: Parts, header: (String) -> String?) -> [UInt8]? {
        guard let outer = header(parts.digest) else { return nil }
        var result = Array(outer.utf8)
        result.reserveCapacity(outer.utf8.count + 2 * parts.payload.count + parts.signature.count + 2)
        result.append(dot)
        if let json = parts.json {
            var bytes: [UInt8] = []
            bytes.reserveCapacity(json.count * 2)
            var copied = json.startIndex
            while let mark = index(of: tilde, in: json[copied...]) {
                // A mark is `"~`, 64 hex digits and a dot: the quote is written with what comes before it.
                let digestEnd = mark + 65
                guard mark > json.startIndex, json[mark - 1] == quote, digestEnd < json.endIndex, json[digestEnd] == dot,
                      isDigest(json[(mark + 1)..<digestEnd]),
                      let inner = header(String(decoding: json[(mark + 1)..<digestEnd], as: UTF8.self)) else { return nil }
                bytes.append(contentsOf: json[copied..<mark])
                bytes.append(contentsOf: inner.utf8)
                copied = digestEnd
            }
            bytes.append(contentsOf: json[copied...])
            result.append(contentsOf: Base64URL.encode(bytes).utf8)
        } else {
            result.append(contentsOf: parts.payload)
        }
        result.append(dot)
        result.append(contentsOf: parts.signature)
        return result
    }

    /// The header digests a stored form names, the envelope's first, each once; none for a JWS stored as it came.
    public static func headerDigests(of stored: String) -> [String] {
        guard let parts = Parts(Array(stored.utf8)[...]) else { return [] }
        var digests = [parts.digest], seen: Set = [parts.digest]
        guard let json = parts.json else { return digests }
        var next = json.startIndex
        while let mark = index(of: tilde, in: json[next...]) {
            let end = min(mark + 65, json.endIndex)
            let digest = String(decoding: json[(mark + 1)..<end], as: UTF8.self)
            if seen.insert(digest).inserted { digests.append(digest) }
            next = end
        }
        return digests
    }

    private static let tilde = UInt8(ascii: "~"), quote = UInt8(ascii: "\""), dot = UInt8(ascii: ".")

    /// Whether `text` is a digest as a stored form names a header: 64 lowercase hex digits.
    static func isDigest(_ text: some Collection<UInt8>) -> Bool {
        text.count == 64 && text.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }

    /// Where `byte` first is in `bytes` (`memchr`: kilobytes are scanned per notification).
    static func index(of byte: UInt8, in bytes: ArraySlice<UInt8>) -> Int? {
        bytes.withUnsafeBufferPointer { buffer in
            guard let base = buffer.baseAddress, let found = memchr(base, Int32(byte), buffer.count) else { return nil }
            return bytes.startIndex + (UnsafeRawPointer(found) - UnsafeRawPointer(base))
        }
    }

    /// `bytes` with every occurrence of `pattern` (which begins with a quote) replaced by `replacement`, and how many
    /// there were.
    private static func replacing(_ pattern: [UInt8], with replacement: [UInt8], in bytes: [UInt8]) -> ([UInt8], Int) {
        var count = 0
        var result: [UInt8] = []
        result.reserveCapacity(bytes.count)
        var copied = 0, next = 0
        while let mark = index(of: pattern[0], in: bytes[next...]) {
            if bytes.count - mark >= pattern.count, bytes[mark..<(mark + pattern.count)].hasSameBytes(as: pattern) {
                result.append(contentsOf: bytes[copied..<mark])
                result.append(contentsOf: replacement)
                count += 1
                copied = mark + pattern.count
                next = copied
            } else {
                next = mark + 1
            }
        }
        result.append(contentsOf: bytes[copied...])
        return (result, count)
    }

    /// A compacted form split: `~digest.payload.signature`, the payload either Base64url or `~` and JSON text.
    private struct Parts {
        let digest: String
        /// The payload's Base64url, or the JSON text's bytes (`json`).
        let payload: ArraySlice<UInt8>
        let json: ArraySlice<UInt8>?
        let signature: ArraySlice<UInt8>

        init?(_ bytes: ArraySlice<UInt8>) {
            let start = bytes.startIndex
            guard bytes.count > 66, bytes[start] == StoredJWS.tilde, bytes[start + 65] == StoredJWS.dot,
                  StoredJWS.isDigest(bytes[(start + 1)..<(start + 65)]) else { return nil }
            // From the end: the signature is the shortest part.
            guard let lastDot = bytes.lastIndex(of: StoredJWS.dot), lastDot > start + 65 else { return nil }
            digest = String(decoding: bytes[(start + 1)..<(start + 65)], as: UTF8.self)
            payload = bytes[(start + 66)..<lastDot]
            signature = bytes[(lastDot + 1)...]
            guard StoredJWS.index(of: StoredJWS.tilde, in: signature) == nil else { return nil }
            if payload.first == StoredJWS.tilde {
                json = payload.dropFirst()
            } else {
                guard StoredJWS.index(of: StoredJWS.tilde, in: payload) == nil else { return nil }
                json = nil
            }
        }
    }
}
