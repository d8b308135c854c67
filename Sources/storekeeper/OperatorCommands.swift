import Foundation

/// `storekeeper server operator add`
struct ServerOperatorAddCommand: Command {
    static let abstract = "Add a console operator (or change their role) and print a one-time login link."
    static let help = """
    EMAIL [--role admin|support|finance|developer] [--password-stdin] [--url URL] [--admin-key KEY]

      --role             What they may see and do (default admin): support — customers and their actions;
                         finance — reports, transactions, metrics; developer — keys, webhooks, products, jobs.
      --password-stdin   Read a password (8 bytes or more) from standard input, hashed with scrypt; else they set
                         one after following the link.

    The link signs them in once, within 24 hours.

    \(serverConnectionHelp)
    """
    let client: AdminClient
    let body: [String: Any]

    init(_ arguments: inout Arguments) throws {
        client = try serverClient(&arguments)
        var body: [String: Any] = ["role": try arguments.option("role") ?? "admin"]
        if arguments.flag("password-stdin") {
            let password = (readLine(strippingNewline: true) ?? "")
            body["password"] = password
        }
        body["email"] = try arguments.single("EMAIL")
        self.body = body
    }

    func run() async throws {
        let data = try await client.send("POST", "/admin/v1/operators", json: body)
        guard let answer = try JSONSerialization.jsonObject(with: data) as? [String: Any], let path = answer["loginPath"] as? String,
              let link = URL(string: path, relativeTo: client.base)?.absoluteString else {
            throw CommandFailure(description: "unexpected answer: \(String(decoding: data, as: UTF8.self))")
        }
        print("\(answer["email"] ?? "") (\(answer["role"] ?? "")): sign in once, within 24 hours, at\n\(link)")
    }
}

/// `storekeeper server operator list`
struct ServerOperatorListCommand: Command {
    static let abstract = "List console operators and their roles."
    static let help = "[--url URL] [--admin-key KEY]\n\n\(serverConnectionHelp)"
    let client: AdminClient

    init(_ arguments: inout Arguments) throws { client = try serverClient(&arguments) }

    func run() async throws { try await client.sendAndPrint("GET", "/admin/v1/operators") }
}

/// `storekeeper server operator remove`
struct ServerOperatorRemoveCommand: Command {
    static let abstract = "Remove a console operator and end their sessions."
    static let help = "EMAIL [--url URL] [--admin-key KEY]\n\n\(serverConnectionHelp)"
    let client: AdminClient
    let email: String

    init(_ arguments: inout Arguments) throws {
        client = try serverClient(&arguments)
        email = try arguments.single("EMAIL")
    }

    func run() async throws { try await client.sendAndPrint("DELETE", "/admin/v1/operators/\(pathSegment(email))") }
}
