import Foundation
import HTTP
@testable import HTTPServer
import Testing

@Suite("Access log lines")
struct AccessLogTests {
    @Test("JSON lines are one valid object each, with the route and request id, and hostile paths escaped")
    func json() throws {
        var response = Response(status: .ok)
        response.route = "/v1/users/:user"
        response.headers["X-Request-Id"] = "req-1"
        let request = Request(method: .get, target: "/v1/users/a\"b\\c%0A")
        let line = AccessLogLine.json(request, status: 200, bytes: 12, millis: 3.25, response: response)
        #expect(line.hasSuffix("}\n") && line.filter { $0 == "\n" }.count == 1)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(object["route"] as? String == "/v1/users/:user" && object["requestId"] as? String == "req-1")
        #expect(object["status"] as? Int == 200 && object["level"] as? String == "info" && object["bytes"] as? Int == 12)
        #expect((object["path"] as? String)?.contains("a\"b\\c") == true)
        let control = AccessLogLine.json(Request(method: .get, target: "/x\u{1}y"), status: 503, bytes: 0, millis: 0, response: nil)
        let parsed = try #require(try JSONSerialization.jsonObject(with: Data(control.utf8)) as? [String: Any])
        #expect(parsed["level"] as? String == "error" && parsed["route"] == nil)
    }
}
