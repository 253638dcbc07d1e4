import Lockstep

/// Seed 000's post list: an ordered list of post ids with no duplicates, replaced or extended.
///
/// Actions on the wire: `{"setPosts":{"posts":["a","b"]}}`, `{"appendPosts":{"posts":["c"]}}`.
public enum Posts: Domain {
    /// The post list: `{"posts":["a","b"]}` on the wire.
    public struct State: Codable, Equatable, Sendable {
        /// In the order they arrived; each post at most once.
        public var posts: [String] = []

        /// A list holding `posts` as given, empty unless given; the caller keeps them free of duplicates.
        public init(posts: [String] = []) { self.posts = posts }
    }

    /// What can happen to the list.
    public enum Action: Codable, Equatable, Sendable {
        /// Replaces the list; later copies of a post already listed are dropped.
        case setPosts(posts: [String])
        /// Adds the posts not yet listed, in order.
        case appendPosts(posts: [String])
    }

    /// The store's name: `posts`.
    public static let name = "posts"
    /// The first and only version of the domain.
    public static let version: UInt32 = 1
    /// An empty list.
    public static var initialState: State { State() }

    /// Refuses, with the code `empty_post`, an action that names an empty post id; accepts every other.
    public static func validate(_ action: Action, in state: State) throws(Rejection) {
        let posts: [String]
        switch action {
        case let .setPosts(list), let .appendPosts(list): posts = list
        }
        if let index = posts.firstIndex(where: \.isEmpty) {
            throw Rejection(code: "empty_post", "posts: post at position \(index) is empty; posts need a non-empty id")
        }
    }

    /// Replaces or extends the list, keeping the first copy of each post.
    public static func reduce(into state: inout State, _ action: Action) {
        switch action {
        case let .setPosts(posts):
            state.posts = []
            append(posts, to: &state.posts)
        case let .appendPosts(posts):
            append(posts, to: &state.posts)
        }
    }

    /// The set only answers membership; the order comes from the arrays, never from the set.
    private static func append(_ posts: [String], to list: inout [String]) {
        var seen = Set(list)
        for post in posts where seen.insert(post).inserted {
            list.append(post)
        }
    }
}
