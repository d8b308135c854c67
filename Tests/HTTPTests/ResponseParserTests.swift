@testable import HTTPClient
import Testing

@Suite("HTTP/1.1 response parser")
struct ResponseParserTests {
    /// Feeds `text` split after every `step` bytes; returns the parser and whether it completed.
    static func parse(_ text: String, step: Int) throws -> ResponseParser {
        var parser = ResponseParser()
        let bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let end = min(bytes.count, offset + step)
            let done = try bytes[offset..<end].withUnsafeBytes { try parser.feed($0) }
            offset = end
            if done { break }
        }
        return parser
    }

    @Test("Content-Length bodies parse the same however the bytes are split", arguments: [1, 2, 7, 1000])
    func contentLength(step: Int) throws {
        let parser = try Self.parse("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"status\":0}", step: step)
        #expect(parser.isComplete)
        #expect(parser.status == 200)
        #expect(parser.header("content-type") == "application/json")
        #expect(String(decoding: parser.body, as: UTF8.self) == "{\"status\":0")  // exactly 11 bytes, the rest is not body
        #expect(parser.keepAlive)
    }

    @Test("Chunked bodies with extensions and trailers", arguments: [1, 3, 1000])
    func chunked(step: Int) throws {
        let wire = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;name=x\r\nhello\r\nA\r\n, world!!!\r\n0\r\nX-Trailer: 1\r\n\r\n"
        let parser = try Self.parse(wire, step: step)
        #expect(parser.isComplete)
        #expect(String(decoding: parser.body, as: UTF8.self) == "hello, world!!!")
    }

    @Test("A body without framing ends with the connection, which is then not reused")
    func untilClose() throws {
        var parser = try Self.parse("HTTP/1.0 200 ok\r\nContent-Type: text/html\r\n\r\n<html>partial", step: 4)
        #expect(!parser.isComplete)
        let ended = parser.finishAtEndOfStream()
        #expect(ended)
        #expect(String(decoding: parser.body, as: UTF8.self) == "<html>partial")
        #expect(!parser.keepAlive)
    }

    @Test("Interim 100 Continue is skipped; Connection: close is honoured")
    func interimAndClose() throws {
        let parser = try Self.parse("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", step: 5)
        #expect(parser.isComplete)
        #expect(parser.status == 503)
        #expect(!parser.keepAlive)
    }

    @Test("Garbage, bad chunk sizes and oversized bodies are errors, not hangs")
    func malformed() {
        #expect(throws: HTTPClientError.self) { try Self.parse("SSH-2.0-OpenSSH\r\n\r\n", step: 100) }
        #expect(throws: HTTPClientError.self) { try Self.parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", step: 100) }
        #expect(throws: HTTPClientError.self) { try Self.parse("HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\n", step: 100) }
        var small = ResponseParser(maxBodyBytes: 4)
        #expect(throws: HTTPClientError.self) {
            _ = try Array("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789".utf8).withUnsafeBytes { try small.feed($0) }
        }
    }
}
