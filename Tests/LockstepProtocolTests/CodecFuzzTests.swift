import Lockstep
import LockstepProtocol
import TestSupport
import Testing

/// Feeds each decoder random and mutated messages from a fixed seed.
///
/// Every input must decode or throw ``ProtocolError`` (typed throws rule out any other error; a trap would
/// end the run), and anything that decodes must be canonical: encoding the value gives back the very
/// input bytes, which decode to the same value.
@Suite struct CodecFuzzTests {
    static let randomInputs = 100_000
    static let mutatedInputs = 100_000
    /// Small limits, so random frames cross them and the tooLarge paths run too.
    static let limits = Limits(maximumBatch: 4, maximumActionBytes: 48)

    @Test func requestDecoderSurvivesFuzzing() async {
        // Seconds of fuzzing: on a thread of its own, in this task, so the cooperative pool stays free.
        await onCheckThread {
            let report = Fuzzer.run(
                seed: 0x5EED_0001,
                headerFrame: 0,
                generate: { random in CodecSamples.randomRequest(limits: Self.limits, using: &random).encode() },
                decode: { frames throws(ProtocolError) in try Request.decode(frames, limits: Self.limits) },
                encode: { $0.encode() }
            )
            report.expect(codes: [.malformed, .unsupportedVersion, .unknownMessageType, .tooLarge, .invalidRange])
        }
    }

    @Test func replyDecoderSurvivesFuzzing() async {
        // Seconds of fuzzing: on a thread of its own, in this task, so the cooperative pool stays free.
        await onCheckThread {
            let report = Fuzzer.run(
                seed: 0x5EED_0002,
                headerFrame: 0,
                generate: { random in CodecSamples.randomReply(limits: Self.limits, using: &random).encode() },
                decode: { frames throws(ProtocolError) in try Reply.decode(frames, limits: Self.limits) },
                encode: { $0.encode() }
            )
            report.expect(codes: [.malformed, .unsupportedVersion, .unknownMessageType, .tooLarge])
        }
    }

    @Test func eventDecoderSurvivesFuzzing() async {
        // Seconds of fuzzing: on a thread of its own, in this task, so the cooperative pool stays free.
        await onCheckThread {
            let report = Fuzzer.run(
                seed: 0x5EED_0003,
                headerFrame: 1,
                generate: { random in CodecSamples.randomEvent(limits: Self.limits, using: &random).encode() },
                // A HEARTBEAT or DIGEST reads the same on either stream: the topic's stream is part of the round trip.
                decode: { frames throws(ProtocolError) in
                    PublishedEvent(
                        event: try Event.decode(frames, limits: Self.limits),
                        inRuns: frames.first?.last == 1
                    )
                },
                encode: { $0.inRuns ? $0.event.encodeForRuns() : $0.event.encode() }
            )
            report.expect(codes: [.malformed, .unsupportedVersion, .unknownMessageType, .tooLarge])
        }
    }
}

/// An event with the stream its topic named.
struct PublishedEvent: Equatable {
    var event: Event
    var inRuns: Bool
}

/// What one fuzz run saw.
struct FuzzReport {
    var corpusSize = 0
    var corpusDecoded = 0
    var randomDecoded = 0
    var mutatedDecoded = 0
    var refusals: [ProtocolError.Code: Int] = [:]
    /// The first few inputs that broke the round-trip rule, described.
    var failures: [String] = []
    var failureCount = 0

    func expect(codes: Set<ProtocolError.Code>) {
        #expect(failureCount == 0, "\(failureCount) inputs broke the round trip, first: \(failures)")
        #expect(corpusDecoded == corpusSize, "only \(corpusDecoded) of \(corpusSize) valid messages decoded")
        // Some inputs of each family must get through, or the run proves nothing about the decode path.
        #expect(randomDecoded > 0, "no random input decoded")
        #expect(mutatedDecoded > 1000, "only \(mutatedDecoded) mutated inputs decoded")
        let seen = Set(refusals.keys)
        #expect(seen.isSuperset(of: codes), "refusals seen: \(refusals)")
    }
}

enum Fuzzer {
    /// Where an input came from, so the report can tell which family got through.
    enum Kind { case corpus, random, mutated }

    /// Header bytes worth trying: version edges and every type byte of the protocol, plus near misses.
    static let interestingBytes: [UInt8] = [
        0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x41, 0x42, 0x43, 0x44, 0x4C, 0x53, 0x7F,
        0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x8F, 0xFF,
    ]
    /// Header lengths of the protocol and their neighbours, so random headers often have a plausible size.
    static let headerSizes = [3, 4, 11, 12, 13, 14, 15, 16, 19, 20, 21, 27, 28, 29, 31, 32, 33, 51, 52, 59, 60, 61]

    static func run<Message: Equatable>(
        seed: UInt64,
        headerFrame: Int,
        generate: (inout SplitMix64) -> [Frame],
        decode: ([Frame]) throws(ProtocolError) -> Message,
        encode: (Message) -> [Frame]
    ) -> FuzzReport {
        var random = SplitMix64(seed: seed)
        var report = FuzzReport()
        let corpus = (0..<256).map { _ in generate(&random) }

        func check(_ input: [Frame], _ kind: Kind) {
            let value: Message
            do throws(ProtocolError) {
                value = try decode(input)
            } catch {
                report.refusals[error.code, default: 0] += 1
                return
            }
            switch kind {
            case .corpus: report.corpusDecoded += 1
            case .random: report.randomDecoded += 1
            case .mutated: report.mutatedDecoded += 1
            }
            let again = encode(value)
            var problem: String?
            if again != input {
                problem = "re-encoding changed the bytes"
            } else {
                do throws(ProtocolError) {
                    if try decode(again) != value { problem = "the re-encoded message decoded to another value" }
                } catch {
                    problem = "the re-encoded message failed: \(error)"
                }
            }
            if let problem {
                report.failureCount += 1
                if report.failures.count < 3 { report.failures.append("\(problem): \(input)") }
            }
        }

        // Decoding the corpus unmutated is a round trip of many random valid values.
        report.corpusSize = corpus.count
        for input in corpus { check(input, .corpus) }
        for _ in 0..<CodecFuzzTests.randomInputs {
            check(randomMessage(headerFrame: headerFrame, using: &random), .random)
        }
        for _ in 0..<CodecFuzzTests.mutatedInputs {
            let original = corpus[Int(random.next() % UInt64(corpus.count))]
            let donor = corpus[Int(random.next() % UInt64(corpus.count))]
            check(mutate(original, donor: donor, headerFrame: headerFrame, using: &random), .mutated)
        }
        return report
    }

    /// 0 to 8 frames of random bytes; the header frame often starts like a real header, so the input gets
    /// past the first checks as often as it fails them.
    static func randomMessage(headerFrame: Int, using random: inout SplitMix64) -> [Frame] {
        let frameCount = Int(random.next() % 9)
        var frames: [Frame] = []
        for index in 0..<frameCount {
            let length: Int
            switch random.next() % 4 {
            case 0: length = headerSizes[Int(random.next() % UInt64(headerSizes.count))]
            case 1: length = Int(random.next() % 80)
            default: length = Int(random.next() % 12)
            }
            var frame = CodecSamples.randomBytes(length, using: &random)
            if index == headerFrame, random.next() % 4 != 0 {
                let prefix: [UInt8] = [
                    0x4C, 0x53, random.next() % 8 == 0 ? pick(interestingBytes, &random) : 0x01,
                    pick(interestingBytes, &random),
                ]
                for (offset, byte) in prefix.enumerated() where offset < frame.count { frame[offset] = byte }
            }
            if index == 0, headerFrame == 1, random.next() % 2 == 0 {
                // A topic that is a valid name and its 0x00, so event inputs get past the topic check.
                frame = Event.topic(for: CodecSamples.randomStore(using: &random))
            }
            frames.append(frame)
        }
        return frames
    }

    /// `original` after one to three random changes of the kinds a broken or hostile peer makes.
    static func mutate(
        _ original: [Frame],
        donor: [Frame],
        headerFrame: Int,
        using random: inout SplitMix64
    ) -> [Frame] {
        var frames = original
        for _ in 0..<(1 + Int(random.next() % 3)) {
            let index = frames.isEmpty ? 0 : Int(random.next() % UInt64(frames.count))
            switch random.next() % 11 {
            case 0 where !frames.isEmpty && !frames[index].isEmpty:
                // Flip one bit.
                let byte = Int(random.next() % UInt64(frames[index].count))
                frames[index][byte] ^= 1 << UInt8(random.next() % 8)
            case 1 where !frames.isEmpty && !frames[index].isEmpty:
                // Truncate.
                frames[index].removeLast(1 + Int(random.next() % UInt64(frames[index].count)))
            case 2 where !frames.isEmpty:
                frames.remove(at: index)
            case 3 where !frames.isEmpty:
                frames.insert(frames[index], at: Int(random.next() % UInt64(frames.count + 1)))
            case 4:
                frames.append(CodecSamples.randomBytes(Int(random.next() % 64), using: &random))
            case 5 where frames.count > headerFrame && !frames[headerFrame].isEmpty:
                // Change a header byte, mostly one of the first four.
                let limit = random.next() % 2 == 0 ? 4 : frames[headerFrame].count
                let byte = Int(random.next() % UInt64(min(limit, frames[headerFrame].count)))
                frames[headerFrame][byte] = pick(interestingBytes, &random)
            case 6 where !frames.isEmpty:
                frames[index] += CodecSamples.randomBytes(1 + Int(random.next() % 8), using: &random)
            case 7 where frames.count >= 2:
                frames.swapAt(index, Int(random.next() % UInt64(frames.count)))
            case 8 where !frames.isEmpty:
                frames[index] = []
            case 9 where !frames.isEmpty && !donor.isEmpty:
                // Splice in a frame of another valid message.
                frames[index] = donor[Int(random.next() % UInt64(donor.count))]
            case 10 where !frames.isEmpty && !frames[index].isEmpty:
                let byte = Int(random.next() % UInt64(frames[index].count))
                frames[index][byte] = UInt8(truncatingIfNeeded: random.next())
            default:
                frames.append([])
            }
        }
        return frames
    }

    static func pick(_ bytes: [UInt8], _ random: inout SplitMix64) -> UInt8 {
        bytes[Int(random.next() % UInt64(bytes.count))]
    }
}
