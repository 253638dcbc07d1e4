import LockstepClient
import Testing

/// Where a replica takes its digests, as its digest form's size says: a large snapshot installed makes them go to the
/// digest thread until a digest form of that state is written small; one written of an earlier state changes nothing.
@Suite struct DigestFormSizeTests {
    @Test func aLargeInstallIsLargeUntilItsOwnDigestFormSaysOtherwise() {
        var size = DigestFormSize()
        #expect(size.isSmall)
        // A digest taken before the install, finishing after it: not of the installed state.
        let before = size.latestInstall
        let install = size.installed(bytes: 100 << 20)
        #expect(!size.isSmall && size.bytes == 100 << 20)
        size.written(80, of: before)
        #expect(!size.isSmall, "a digest form of the state before the install says nothing of this one")
        size.written(80, of: install)
        #expect(size.isSmall && size.bytes == 80)
        // A small snapshot keeps what was known; a failed digest (no bytes) too.
        _ = size.installed(bytes: 1_000)
        #expect(size.isSmall && size.bytes == 80)
        size.written(nil, of: size.latestInstall)
        #expect(size.bytes == 80)
    }
}
