import Foundation
import Lockstep
import LockstepServer
import ReplayFixtures

// A daemon of one version of the `shelf` domain (SHELF_VERSION: 1, 2, 2-without-upgrade or 3) beside one of the
// `tally` domain (TALLY_VERSION: 1 or 2-without-upgrade): the upgrade tests run each version's daemon on the
// journal the one before wrote.
let shelves: [String: any Domain.Type] = [
    "1": ShelfV1.self, "2": ShelfV2.self, "2-without-upgrade": ShelfV2WithoutUpgrade.self, "3": ShelfV3.self,
]
let tallies: [String: any Domain.Type] = ["1": TallyV1.self, "2-without-upgrade": TallyV2WithoutUpgrade.self]
let environment = ProcessInfo.processInfo.environment
guard let shelf = shelves[environment["SHELF_VERSION"] ?? "1"], let tally = tallies[environment["TALLY_VERSION"] ?? "1"]
else {
    FileHandle.standardError.write(
        Data(
            "SHELF_VERSION must be one of \(shelves.keys.sorted()), TALLY_VERSION one of \(tallies.keys.sorted())\n"
                .utf8
        )
    )
    exit(64)
}
await LockstepDaemonMain.run(domains: [shelf, tally], commandName: "shelf-daemon")
