import Foundation
import Lockstep
import LockstepServer
import ReplayFixtures

// A daemon of one version of the `shelf` domain, chosen by SHELF_VERSION (1, 2, 2-without-upgrade or 3): the
// upgrade tests run each version's daemon on the journal the one before wrote.
let versions: [String: any Domain.Type] = [
    "1": ShelfV1.self, "2": ShelfV2.self, "2-without-upgrade": ShelfV2WithoutUpgrade.self, "3": ShelfV3.self,
]
let chosen = ProcessInfo.processInfo.environment["SHELF_VERSION"] ?? "1"
guard let domain = versions[chosen] else {
    FileHandle.standardError.write(Data("SHELF_VERSION must be one of \(versions.keys.sorted()), got \(chosen)\n".utf8))
    exit(64)
}
await LockstepDaemonMain.run(domains: [domain], commandName: "shelf-daemon")
