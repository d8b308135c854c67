import Foundation

/// The command tree of `storekeeper`.
let tree = CommandNode.group(abstract: "Storekeeper: a local App Store, a purchase server and a StoreKit client.", children: [
    ("receipt", .group(abstract: "Work with App Store receipts.", children: [
        ("decode", .command(ReceiptDecodeCommand.self)),
    ])),
])

let status = await tree.dispatch(path: ["storekeeper"], words: Array(CommandLine.arguments.dropFirst()))
exit(status)
