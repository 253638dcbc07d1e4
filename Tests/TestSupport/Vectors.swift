import Foundation

/// The test vectors in `Tests/Interop/<file>` that the Python client's tests check too, as `Vector`s; none when the
/// file is missing or unreadable (each suite's `theVectorFileIsThere` test says so).
public func interopVectors<Vector: Decodable>(_ file: String, as _: Vector.Type) -> [Vector] {
    let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("../Interop/\(file)")
    guard let data = try? Data(contentsOf: url), let vectors = try? JSONDecoder().decode([Vector].self, from: data)
    else { return [] }
    return vectors
}
