import ForgePushTokenOwner

/// The two Lua scripts that are the only writers of `PREFIX:state`, and the parsing of their
/// replies (docs/replicas.md, "What lives in Redis").
///
/// Both run atomically in Redis (Redis command reference: `EVAL`, `EVALSHA`, `SCRIPT LOAD`;
/// "Scripting with Lua"). Both take `KEYS[1]` = `PREFIX:state`, `KEYS[2]` = `PREFIX:changes` and
/// the replica's own state (`ARGV[2]` version, `ARGV[3]` token or empty for none, `ARGV[4]` `1`
/// when the replica has a state at all, `0` before it first read one), and `ARGV[5]` the writer's
/// id for the `"writer"` field of the messages they publish. Both first validate the key: a key
/// that is not a hash, a missing or non-decimal `version`, a `version` above 2^53 - 1 (Lua numbers
/// are doubles, exact only up to there), or a `token` that is not 2 to 512 lowercase hex digits (a
/// whole number of bytes, at most `TokenState.maxTokenBytes`) makes the script
/// fail with an `INVALIDSTATE …` error and write nothing.
///
/// Reconciliation, shared by both (docs/replicas.md, "When something fails"):
/// - key missing, or stored version below the replica's: the replica's state is written back
///   ("highest version wins") and published;
/// - same version, different token: the stored token wins and the version is bumped by one and
///   published, so that no id names two values;
/// - otherwise the stored state stands.
///
/// The change script (`ARGV[1]` = the proposed token, empty for "no token") then compares with
/// the stored token and only if it differs stores it, increments `version` and publishes it. A
/// version that would pass 2^53 - 1 is never written: the script fails with `VERSIONEXHAUSTED …`.
///
/// Both reply `{changed, version, token|false, reconciliation, previous version}`:
/// `changed` 1 or 0, `version` a decimal string, `reconciliation` one of `none`, `written`,
/// `bumped`, and the previous stored version (decimal, or empty when the key was missing).
enum RedisScripts {
    private static let common = """
        local key, channel, writer = KEYS[1], KEYS[2], ARGV[5]
        local limit = 9007199254740991
        local function fmt(n) return string.format('%d', n) end
        local function publish(v, t)
          local body
          if t then body = '{"version":' .. fmt(v) .. ',"token":"' .. t .. '","writer":"' .. writer .. '"}'
          else body = '{"version":' .. fmt(v) .. ',"token":null,"writer":"' .. writer .. '"}' end
          redis.call('PUBLISH', channel, body)
        end
        local function store(v, t)
          if t then redis.call('HSET', key, 'version', fmt(v), 'token', t)
          else redis.call('HSET', key, 'version', fmt(v)); redis.call('HDEL', key, 'token') end
        end
        local function exhausted()
          return redis.error_reply('VERSIONEXHAUSTED the version of ' .. key .. ' is 2^53 - 1, the largest one kept')
        end
        local kind = redis.call('TYPE', key)['ok']
        local sv, st = nil, false
        if kind ~= 'none' then
          if kind ~= 'hash' then return redis.error_reply('INVALIDSTATE ' .. key .. ' is a ' .. kind .. ', not a hash') end
          local text = redis.call('HGET', key, 'version')
          if not text then return redis.error_reply('INVALIDSTATE ' .. key .. ' has no version field') end
          if not string.match(text, '^%d+$') or string.len(text) > 16 or tonumber(text) > limit then
            return redis.error_reply('INVALIDSTATE the version field of ' .. key .. ' is not a decimal number up to 2^53 - 1')
          end
          sv = tonumber(text)
          st = redis.call('HGET', key, 'token')
          if st and (not string.match(st, '^[0-9a-f]+$') or string.len(st) % 2 ~= 0 or string.len(st) > 512) then
            return redis.error_reply('INVALIDSTATE the token field of ' .. key .. ' is not 2 to 512 lowercase hex digits')
          end
        end
        local rv, rt, known = tonumber(ARGV[2]), ARGV[3], ARGV[4] == '1'
        if rt == '' then rt = false end
        local reconciled, previous = 'none', ''
        if sv then previous = fmt(sv) end
        local v, t = sv or 0, st
        if known and rv <= limit and (sv == nil or sv < rv) and not (sv == nil and rv == 0 and not rt) then
          v, t = rv, rt
          store(v, t)
          publish(v, t)
          reconciled = 'written'
        elseif known and sv == rv and st ~= rt then
          if sv >= limit then return exhausted() end
          v = sv + 1
          store(v, t)
          publish(v, t)
          reconciled = 'bumped'
        end
        """

    /// Reads and reconciles `PREFIX:state` (the read after every (re)connect, the periodic
    /// check, the refresh before serving a `Last-Event-ID` above the replica's version).
    static let sync =
        common + """

            return {0, fmt(v), t, reconciled, previous}
            """

    /// Changes the token (a `POST /register` or `POST /fail`).
    static let change =
        common + """

            local nt = ARGV[1]
            if nt == '' then nt = false end
            if nt == t then return {0, fmt(v), t, reconciled, previous} end
            if v >= limit then return exhausted() end
            v = v + 1
            store(v, nt)
            publish(v, nt)
            return {1, fmt(v), nt, reconciled, previous}
            """

    /// What the replica applies after a script ran.
    struct Result: Equatable {
        /// The state in Redis after the script.
        var state: TokenState
        /// Whether the change script changed the token.
        var changed: Bool
        /// What the reconciliation did.
        var reconciliation: Reconciliation
        /// The stored version before the script ran, `nil` when the key was missing.
        var previousVersion: UInt64?
    }

    /// What the reconciliation step did.
    enum Reconciliation: String, Equatable {
        /// The stored state stood.
        case none
        /// The replica's state was written back (the key was missing or lower).
        case written
        /// Same version, different token: the stored token won at the next version.
        case bumped
    }

    /// Parses a script's reply. A reply that says `changed` is believed only when its version is
    /// above the stored one before the script (and above 0): a write never answers "changed"
    /// unless the version went up.
    /// - Throws: `RedisCodec.Invalid` when the reply is not of the documented shape, or a version
    ///   in it is above 2^53 - 1.
    static func parse(_ reply: RedisReply) throws(RedisCodec.Invalid) -> Result {
        guard case .array(let items) = reply, items.count == 5,
            case .integer(let changed) = items[0], changed == 0 || changed == 1,
            let versionText = items[1].text, let version = RedisCodec.parseVersion(versionText),
            let reconciliationText = items[3].text,
            let reconciliation = Reconciliation(rawValue: reconciliationText),
            let previousText = items[4].text
        else {
            throw RedisCodec.Invalid("unexpected script reply")
        }
        var token: String?
        switch items[2] {
        case .null: token = nil
        case .bulk(let bytes):
            let text = String(decoding: bytes, as: UTF8.self)
            guard RedisCodec.isValidToken(text) else {
                throw RedisCodec.Invalid("the script returned a token that is not lowercase hex")
            }
            token = text
        default:
            throw RedisCodec.Invalid("unexpected token in the script reply")
        }
        var previous: UInt64?
        if !previousText.isEmpty {
            guard let parsed = RedisCodec.parseVersion(previousText) else {
                throw RedisCodec.Invalid("the script returned a previous version that is not up to 2^53 - 1")
            }
            previous = parsed
        }
        if changed == 1, version == 0 || version <= previous ?? 0 {
            throw RedisCodec.Invalid("the script said changed, but the version did not go up")
        }
        return Result(
            state: TokenState(version: version, token: token), changed: changed == 1,
            reconciliation: reconciliation, previousVersion: previous)
    }

    /// The `ARGV` for the replica's own state (version, token or empty for none, known flag) and
    /// the writer's id.
    static func replicaArguments(_ state: TokenState?, writer: String) -> [String] {
        guard let state else { return ["0", "", "0", writer] }
        return [String(state.version), state.token ?? "", "1", writer]
    }
}
