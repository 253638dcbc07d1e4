import LockstepServer
import Testing

@Suite struct TOMLTests {
    @Test func readsTheSubsetTheConfigurationUses() throws {
        let document = try TOMLDocument.parse(
            """
            # lockstepd
            data_dir = "/var/lib/lockstep"   # trailing comment
            events_endpoint = 'ipc:///run/lockstep/events'
            domains = [
              "counter", "todos",  # two of them
              "posts",
            ]
            durability = "fsync"
            escaped = "tab\\there \\"quoted\\" \\u00e9"

            [intervals]
            heartbeat_ms = 1_000
            negative = -3
            strict = true
            empty = []
            """
        )
        #expect(
            document.tables[""] == [
                "data_dir": .string("/var/lib/lockstep"),
                "events_endpoint": .string("ipc:///run/lockstep/events"),
                "domains": .array([.string("counter"), .string("todos"), .string("posts")]),
                "durability": .string("fsync"),
                "escaped": .string("tab\there \"quoted\" é"),
            ]
        )
        #expect(
            document.tables["intervals"] == [
                "heartbeat_ms": .integer(1_000), "negative": .integer(-3), "strict": .boolean(true),
                "empty": .array([]),
            ]
        )
    }

    @Test(arguments: [
        ("a = 1\na = 2", 2, "key 'a' is set twice"),
        ("[t]\n[t]", 2, "table [t] is defined twice"),
        ("a.b = 1", 1, "dotted keys are not supported"),
        ("a = \"open", 1, "string is not closed"),
        ("a = 1.5", 1, "only whole numbers"),
        ("a = 99999999999999999999", 1, "is not a 64-bit integer"),
        ("a = 1 2", 1, "unexpected text after the value"),
        ("a = [1 2]", 1, "expected ',' or ']'"),
        ("a = {x = 1}", 1, "expected a string, an integer"),
        ("a 1", 1, "expected '=' after key 'a'"),
        ("a = \"\\q\"", 1, "unknown escape"),
        ("\n\n = 1", 3, "expected a key"),
        ("a = 01", 1, "leading zero"),
        ("a = -007", 1, "leading zero"),
        ("a = 1_", 1, "underscore in a number must stand between two digits"),
        ("a = 1__0", 1, "underscore in a number must stand between two digits"),
        ("a = _1", 1, "expected a string, an integer"),
        ("a = +_1", 1, "underscore in a number must stand between two digits"),
    ])
    func refusesWhatItDoesNotReadNamingTheLine(text: String, line: Int, reason: String) {
        let error = #expect(throws: TOMLDocument.ParseError.self) { try TOMLDocument.parse(text) }
        #expect(error?.line == line)
        #expect(error?.reason.contains(reason) == true, "\(String(describing: error))")
    }
}
