import Foundation
import HTTP
import Testing

@Suite("Router")
struct RouterTests {
    static let router: Router = {
        var router = Router()
        router.on(.get, "/items/:id") { request in .text("item \(request.parameters["id"] ?? "")") }
        router.on(.post, "/items") { request in
            struct Item: Codable { let name: String }
            let item = try request.decode(Item.self)
            return .json(["created": item.name], status: .created)
        }
        return router
    }()

    @Test("Path parameters are captured and percent-decoded")
    func parameters() async {
        let response = await Self.router.respond(to: Request(method: .get, target: "/items/a%20b?x=1"))
        #expect(response.status == .ok)
        #expect(String(decoding: response.body, as: UTF8.self) == "item a b")
    }

    @Test("Unknown paths answer 404 and wrong methods 405, both in the JSON error shape")
    func errors() async throws {
        let missing = await Self.router.respond(to: Request(method: .get, target: "/nothing"))
        #expect(missing.status == .notFound)
        let wrong = await Self.router.respond(to: Request(method: .delete, target: "/items"))
        #expect(wrong.status == .methodNotAllowed)
        let object = try JSONSerialization.jsonObject(with: wrong.body) as? [String: [String: String]]
        #expect(object?["error"]?["code"] == "method_not_allowed")
    }

    @Test("Bad JSON bodies answer 400 invalid_json naming the problem")
    func badJSON() async throws {
        let response = await Self.router.respond(to: Request(method: .post, target: "/items", body: Data(#"{"nom":"x"}"#.utf8)))
        #expect(response.status == .badRequest)
        let object = try JSONSerialization.jsonObject(with: response.body) as? [String: [String: String]]
        #expect(object?["error"]?["code"] == "invalid_json")
        #expect(object?["error"]?["message"]?.contains("name") == true)
    }

    @Test("Queries are parsed and headers are case-insensitive")
    func requestParsing() {
        let request = Request(method: .get, target: "/a?x=1&y=hello+world&z=%2F", headers: ["Host": "Buy.iTunes.Apple.com:443"])
        #expect(request.query == ["x": "1", "y": "hello world", "z": "/"])
        #expect(request.host == "buy.itunes.apple.com")
        #expect(request.header("HOST") == "Buy.iTunes.Apple.com:443")
    }

    @Test("The host is the Host header before its first colon, lower-cased, for every shape of header")
    func hostShapes() {
        let headers = ["buy.itunes.apple.com", "Buy.iTunes.Apple.com:443", "127.0.0.1:8010", "LOCALHOST", ":80", "::", "",
                       "[::1]:8080", "Straße.example:1", "ÉCOLE.example", "a:b:c"]
        for header in headers {
            let expected = header.split(separator: ":").first.map(String.init)?.lowercased()
            #expect(Request(method: .get, target: "/", headers: ["Host": header]).host == expected, "Host: \(header)")
        }
        #expect(Request(method: .get, target: "/").host == nil)
    }
}
