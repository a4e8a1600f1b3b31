// An edgekit MLX variant in an iOS app, through mlx-swift-lm (MLXLLM, MLXLMCommon) with
// swift-transformers' tokenizer (through mlx-swift-lm's MLXHuggingFace macro).
//
// NOT COMPILED AND NOT RUN ON A PHONE: written on an x86_64 Linux host with no Swift
// toolchain. The API names were checked against the sources of mlx-swift-lm 3.31.x
// (Libraries/MLXLMCommon, Libraries/MLXLLM, Libraries/MLXHuggingFace), mlx-swift 0.31.x
// (Source/MLX/Memory.swift) and swift-transformers 1.3.x. README.md beside this file covers
// the package dependencies, the Increased Memory Limit entitlement, the Release build, what
// the app copies out of the variant folder, and what was not checked.
//
// Use, from SwiftUI for instance:
//     let chat = try await EdgekitChat.load(folder: variantURL, contextTokens: 4096)
//     chat.send("Hello", onText: { output += $0 }, onDone: { info, error in ... })
//     chat.stop()   // a Stop button

import Foundation
import MLX
import MLXHuggingFace
import MLXLLM
import MLXLMCommon
import Tokenizers  // the expansion of #huggingFaceTokenizerLoader() calls Tokenizers.AutoTokenizer
import os  // os_proc_available_memory

/// Why a variant folder is refused before MLX opens any of it.
enum EdgekitVariantError: LocalizedError {
    case missingFile(String)
    case unknownKVCache(String)
    case notEnoughMemory(needed: Int, available: Int)

    var errorDescription: String? {
        switch self {
        case .missingFile(let name):
            return "the variant folder has no \(name): copy the folder edgekit wrote, whole and unchanged"
        case .unknownKVCache(let value):
            return "kv_cache=\(value) is not one edgekit writes for MLX (f16, q8_0, q4_0)"
        case .notEnoughMemory(let needed, let available):
            return "the variant needs about \(needed >> 20) MiB and iOS lets this app allocate "
                + "\(available >> 20) MiB now: ship a smaller quant (edgekit plan MODEL --device "
                + "iphone-16-pro), or check the Increased Memory Limit entitlement"
        }
    }
}

/// The part of edgekit.json the app needs. Without the file the cache is f16, as edgekit's own default.
private struct EdgekitRecord: Decodable {
    let kvCache: String?

    enum CodingKeys: String, CodingKey {
        case kvCache = "kv_cache"
    }
}

/// edgekit's KV-cache name as mlx-swift-lm's typed cache request. The same mapping edgekit's
/// Python target gives mlx-lm (converters/mlx/plan.py KV_BITS: q8_0 -> 8 bits, q4_0 -> 4 bits,
/// groups of 64, from the first token); nil keeps the full-precision cache.
func kvCacheConfiguration(_ kvCache: String) throws -> KVCacheConfiguration? {
    let bits: Int
    switch kvCache.lowercased() {
    case "f16": return nil
    case "q8_0": bits = 8
    case "q4_0": bits = 4
    default: throw EdgekitVariantError.unknownKVCache(kvCache)
    }
    return KVCacheConfiguration(
        strategy: .affine(try AffineKVCacheConfiguration(bits: bits, groupSize: 64, compressionStart: 0)))
}

/// A variant folder, checked before loading: a missing file or a variant too large for the app's
/// memory limit fails here with a message, instead of as a jetsam kill halfway through loading.
struct EdgekitVariant {
    let folder: URL
    let kvCache: String
    let weightBytes: Int

    // Beyond the weights: activations, the KV cache, MLX's buffer cache (capped in
    // EdgekitChat.load) and the app itself. This is the ~0.5 GiB that the iphone-16-pro
    // profile keeps back from the ~6 GB an entitled app gets.
    static let headroomBytes = 512 << 20

    /// `kvCache` overrides edgekit.json, e.g. with the bundle manifest's runtime.kv_cache.
    init(folder: URL, kvCache: String? = nil) throws {
        self.folder = folder
        let files = FileManager.default
        // what mlx-swift-lm (config.json) and swift-transformers (tokenizer.json) cannot do without
        for name in ["config.json", "tokenizer.json"]
        where !files.fileExists(atPath: folder.appending(component: name).path) {
            throw EdgekitVariantError.missingFile(name)
        }
        let weights = try files.contentsOfDirectory(atPath: folder.path)
            .filter { $0.hasSuffix(".safetensors") }
        guard !weights.isEmpty else { throw EdgekitVariantError.missingFile("model.safetensors") }
        weightBytes = try weights.reduce(0) { total, name in
            let size = try files.attributesOfItem(atPath: folder.appending(component: name).path)[.size]
            return total + ((size as? NSNumber)?.intValue ?? 0)
        }
        let record = folder.appending(component: "edgekit.json")
        if let kvCache {
            self.kvCache = kvCache
        } else if files.fileExists(atPath: record.path) {
            // present but unreadable is an error, not a silent fall-back to f16
            self.kvCache = try JSONDecoder().decode(EdgekitRecord.self, from: Data(contentsOf: record))
                .kvCache ?? "f16"
        } else {
            self.kvCache = "f16"
        }
        _ = try kvCacheConfiguration(self.kvCache)  // refuse an unknown value before loading
    }

    /// Refuses when the weights plus headroom exceed what iOS says this app may still allocate.
    /// The figure is advisory, as Apple's documentation says, and changes over time, so read it
    /// just before loading. The Increased Memory Limit entitlement raises it on devices that
    /// support it.
    func checkMemory() throws {
        #if os(macOS)
            let available = 0  // a native macOS build (multiplatform development): no jetsam limit
        #else
            let available = Int(os_proc_available_memory())  // iOS 13+, also Mac Catalyst
        #endif
        let needed = weightBytes + Self.headroomBytes
        // 0: not an app (a unit-test host, say) or already over its limit: nothing to compare
        if available > 0 && needed > available {
            throw EdgekitVariantError.notEnoughMemory(needed: needed, available: available)
        }
    }
}

/// One conversation with an edgekit MLX variant. Bound to the main actor because ChatSession
/// is not thread-safe (one task at a time); mlx-swift-lm runs the generation itself off the
/// main actor, and the text chunks arrive here, ready for the UI.
@MainActor
final class EdgekitChat {
    private let container: ModelContainer
    private let session: ChatSession
    private let contextTokens: Int
    private let maxTokens: Int
    private var reply: Task<Void, Never>?

    private init(container: ModelContainer, session: ChatSession, contextTokens: Int, maxTokens: Int) {
        self.container = container
        self.session = session
        self.contextTokens = contextTokens
        self.maxTokens = maxTokens
    }

    /// Loads the variant in `folder` from local files (no Hub, no network).
    /// `contextTokens` is the variant's runtime.context from the bundle's manifest.json: the
    /// context edgekit planned the memory for. `temperature: 0` gives greedy decoding.
    static func load(
        folder: URL,
        contextTokens: Int,
        instructions: String? = nil,
        kvCache: String? = nil,
        maxTokens: Int = 512,
        temperature: Float = 0.7,
        topP: Float = 0.9
    ) async throws -> EdgekitChat {
        let variant = try EdgekitVariant(folder: folder, kvCache: kvCache)
        try variant.checkMemory()
        // MLX keeps freed buffers for reuse, and on a phone that cache counts against the
        // jetsam limit; 20 MB is what mlx-swift-examples' iOS apps allow. (GPU.set(cacheLimit:)
        // is the deprecated spelling of this.)
        Memory.cacheLimit = 20 * 1024 * 1024
        let container = try await LLMModelFactory.shared.loadContainer(
            from: folder, using: #huggingFaceTokenizerLoader())
        let parameters = GenerateParameters(
            maxTokens: maxTokens,
            kvCache: try kvCacheConfiguration(variant.kvCache),
            temperature: temperature,
            topP: topP)
        let session = ChatSession(container, instructions: instructions, generateParameters: parameters)
        return EdgekitChat(
            container: container, session: session, contextTokens: contextTokens, maxTokens: maxTokens)
    }

    /// Streams the reply to `text` into `onText`. `onDone` gets the completion info (tokens/s,
    /// stopReason; nil if the reply was stopped before it arrived) and the error, if any. A new
    /// call stops the reply in progress first.
    func send(
        _ text: String,
        onText: @escaping @MainActor (String) -> Void,
        onDone: @escaping @MainActor (GenerateCompletionInfo?, Error?) -> Void
    ) {
        let previous = reply
        previous?.cancel()
        reply = Task {
            await previous?.value  // the session serves one call at a time
            var info: GenerateCompletionInfo?
            do {
                try await fitContext(adding: text)
                for try await item in session.streamDetails(to: text) {
                    switch item {
                    case .chunk(let chunk): onText(chunk)
                    case .info(let done): info = done
                    default: break  // tool calls: this sample passes no tools
                    }
                }
                // a stopped reply ends here too, normally without an .info (the stream was
                // already ended when mlx-swift-lm built it): info is nil then
                onDone(info, nil)
            } catch {
                onDone(info, error)
            }
        }
    }

    /// Stops the reply in progress. Call it when the app leaves the foreground too: iOS
    /// refuses GPU work from a backgrounded app (README, section 8). Cancelling the task that
    /// reads the stream ends the stream, whose termination cancels mlx-swift-lm's generation
    /// task; that task checks Task.isCancelled on every token. The session waits for it to
    /// settle before its next call.
    func stop() {
        reply?.cancel()
    }

    /// Keeps the conversation within the context edgekit planned the memory for. A
    /// capacity-bounded cache would rotate instead of being compressed (mlx-swift-lm's
    /// kv-cache-quantization.md), so the budget is enforced here, before the turn. The count is
    /// approximate: the chat template adds a few tokens per turn. Clearing the history is the
    /// simplest policy; dropping or summarising old turns are others.
    private func fitContext(adding text: String) async throws {
        let used = try await session.cacheStatus().processedTokenCount ?? 0
        let prompt = await container.encode(text).count
        if used + prompt + maxTokens > contextTokens {
            await session.clear()
        }
    }
}

/// One reply without a session (no history, no KV-cache reuse between calls): the route
/// mlx-swift-examples' MLXChatExample takes. Cancel the task iterating the stream to stop it.
func generateOnce(
    container: ModelContainer, system: String, user: String, parameters: GenerateParameters
) async throws -> AsyncStream<Generation> {
    let input = try await container.prepare(input: UserInput(chat: [.system(system), .user(user)]))
    return try await container.generate(input: input, parameters: parameters)
}
