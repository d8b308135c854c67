import Foundation

/// A usage error: printed with the command's help, exit code 64.
struct UsageError: Error, CustomStringConvertible {
    let description: String
}

/// A failure while running a command: printed, exit code 1.
struct CommandFailure: Error, CustomStringConvertible {
    let description: String
}

/// The arguments of one command: `--name value`, `--name=value`, flags and positionals.
struct Arguments {
    private var tokens: [String]
    private var consumed: Set<Int> = []

    init(_ tokens: [String]) { self.tokens = tokens }

    /// Whether `--help` or `-h` was given.
    var wantsHelp: Bool { tokens.contains("--help") || tokens.contains("-h") }

    /// The last value of an option.
    mutating func option(_ name: String) throws -> String? { try options(name).last }

    /// Every value of a repeatable option.
    mutating func options(_ name: String) throws -> [String] {
        var values: [String] = []
        var index = 0
        while index < tokens.count {
            let token = tokens[index]
            if token == "--\(name)" {
                guard index + 1 < tokens.count else { throw UsageError(description: "--\(name) needs a value") }
                values.append(tokens[index + 1])
                consumed.insert(index)
                consumed.insert(index + 1)
                index += 2
                continue
            }
            if token.hasPrefix("--\(name)=") {
                values.append(String(token.dropFirst(name.count + 3)))
                consumed.insert(index)
            }
            index += 1
        }
        return values
    }

    /// Whether a flag is present.
    mutating func flag(_ name: String) -> Bool {
        var found = false
        for (index, token) in tokens.enumerated() where token == "--\(name)" {
            consumed.insert(index)
            found = true
        }
        return found
    }

    /// The remaining positional arguments; call after all options were read.
    mutating func positionals() throws -> [String] {
        var result: [String] = []
        for (index, token) in tokens.enumerated() where !consumed.contains(index) {
            if token.hasPrefix("--") && token.count > 2 { throw UsageError(description: "unknown option \(token)") }
            result.append(token)
            consumed.insert(index)
        }
        return result
    }

    /// The one positional argument a command takes (named in the error when missing or repeated).
    mutating func single(_ name: String) throws -> String {
        let rest = try positionals()
        guard rest.count == 1 else { throw UsageError(description: "give one \(name)") }
        return rest[0]
    }

    /// Exactly `count` positional arguments (named by `names` in the error).
    mutating func positionals(_ count: Int, _ names: String) throws -> [String] {
        let rest = try positionals()
        guard rest.count == count else { throw UsageError(description: "give \(names)") }
        return rest
    }

    /// Throws if anything was not consumed.
    mutating func finish() throws {
        let rest = try positionals()
        if !rest.isEmpty { throw UsageError(description: "unexpected argument \(rest[0])") }
    }
}

/// A runnable command.
protocol Command {
    /// One line saying what it does.
    static var abstract: String { get }
    /// Usage lines and options.
    static var help: String { get }
    /// Parses arguments.
    init(_ arguments: inout Arguments) throws
    /// Runs.
    func run() async throws
}

/// A node of the command tree: either a command or a group of subcommands.
indirect enum CommandNode {
    case command(any Command.Type)
    case group(abstract: String, children: [(String, CommandNode)])

    var abstract: String {
        switch self {
        case .command(let type): return type.abstract
        case .group(let abstract, _): return abstract
        }
    }

    /// Finds the command for `words` and runs it, printing help where asked or needed.
    func dispatch(path: [String], words: [String]) async -> Int32 {
        switch self {
        case .command(let type):
            var arguments = Arguments(words)
            if arguments.wantsHelp {
                print("\(type.abstract)\n\nUSAGE: \(path.joined(separator: " ")) \(type.help)")
                return 0
            }
            do {
                let command = try type.init(&arguments)
                try arguments.finish()
                try await command.run()
                return 0
            } catch let error as UsageError {
                FileHandle.standardError.write(Data("error: \(error.description)\n\nUSAGE: \(path.joined(separator: " ")) \(type.help)\n".utf8))
                return 64
            } catch {
                FileHandle.standardError.write(Data("error: \(error)\n".utf8))
                return 1
            }
        case .group(let abstract, let children):
            guard let first = words.first, !first.hasPrefix("-") else {
                var text = "\(abstract)\n\nUSAGE: \(path.joined(separator: " ")) <subcommand>\n\nSUBCOMMANDS:\n"
                for (name, child) in children { text += "  \(name.padding(toLength: 14, withPad: " ", startingAt: 0)) \(child.abstract)\n" }
                let helpAsked = words.first == "--help" || words.first == "-h"
                if helpAsked { print(text, terminator: "") } else { FileHandle.standardError.write(Data(text.utf8)) }
                return helpAsked ? 0 : 64
            }
            guard let child = children.first(where: { $0.0 == first })?.1 else {
                FileHandle.standardError.write(Data("error: unknown subcommand '\(first)' of \(path.joined(separator: " "))\n".utf8))
                return 64
            }
            return await child.dispatch(path: path + [first], words: Array(words.dropFirst()))
        }
    }
}

/// Reads a whole file, or standard input for `-`.
func readInput(_ path: String) throws -> Data {
    if path == "-" { return FileHandle.standardInput.readDataToEndOfFile() }
    guard let data = FileManager.default.contents(atPath: path) else { throw CommandFailure(description: "cannot read \(path)") }
    return data
}

/// Prints a JSON value with sorted keys.
func printJSON(_ object: Any) throws {
    let data = try JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes])
    print(String(decoding: data, as: UTF8.self))
}

/// Writes a line to standard output immediately (no buffering), for lines other programs wait for.
func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

/// Writes a warning line to standard error (standard output's first line belongs to scripts).
func warn(_ line: String) {
    FileHandle.standardError.write(Data(("warning: " + line + "\n").utf8))
}
