import AppStoreCrypto
import AppStoreModels
import Foundation

/// A user token: a JWT the developer's backend signs (HS256 with the app's `userTokenSecret`, or
/// ES256 with the key registered as `userTokenPublicKey`) naming the app user (`sub`) it lets the
/// app act for, valid until `exp`, at most 24 hours ahead. The app sends it as
/// `Storekeeper-User-Token` beside its public key.
public struct UserToken: Sendable, Equatable {
    /// The app user id the token names (normalised as every user id is).
    public let subject: String
    /// When it stops being valid.
    public let expiresAt: Date

    /// The header that carries it.
    public static let header = "storekeeper-user-token"
    /// The longest a token may live.
    public static let maximumLifetime: TimeInterval = 24 * 3600
    /// Clock skew allowed between the developer's backend and this server.
    public static let allowedSkew: TimeInterval = 60
    /// The longest token read (a JWT with a short payload is a few hundred bytes).
    public static let maximumLength = 4096

    /// Verifies `compact` for `app` at `now`; every failure is a 401 with a code that says which rule broke.
    public init(_ compact: String, app: ServerApp, now: Date) throws(ServerError) {
        func refuse(_ code: ServerError.Code, _ message: String) -> ServerError { ServerError(code, message) }
        guard compact.utf8.count <= Self.maximumLength else { throw refuse(.invalidUserToken, "The user token is longer than \(Self.maximumLength) bytes.") }
        let jws: JWS
        do { jws = try JWS(compact: compact) } catch { throw refuse(.invalidUserToken, "The user token is not a compact JWT.") }
        switch jws.header["alg"]?.text {
        case "HS256"?:
            guard let secret = app.userTokenSecret else {
                throw refuse(.invalidUserToken, "This app has no userTokenSecret; sign user tokens with the registered ES256 key.")
            }
            let expected = HMAC.sha256(key: Array(secret.utf8), message: jws.signingInput)
            // A MAC that could not be computed is empty: never equal to an empty signature.
            guard expected.count == 32, HMAC.constantTimeEqual(expected, jws.signature) else {
                throw refuse(.invalidUserToken, "The user token's signature is invalid.")
            }
        case "ES256"?:
            guard let pem = app.userTokenPublicKey, let key = try? PublicKey(pem: pem) else {
                throw refuse(.invalidUserToken, "This app has no userTokenPublicKey; sign user tokens with HS256 and the userTokenSecret.")
            }
            guard key.isValidES256(jws.signature, for: jws.signingInput) else { throw refuse(.invalidUserToken, "The user token's signature is invalid.") }
        default:
            throw refuse(.invalidUserToken, "User tokens are signed HS256 or ES256.")
        }
        guard let claims = try? jws.payloadJSON(), claims.isObject else { throw refuse(.invalidUserToken, "The user token's claims are not a JSON object.") }
        func number(_ name: String) -> Double? {
            if case .number(let text)? = claims[name], let value = Double(text), value.isFinite { return value }
            return nil
        }
        guard case .string(let subject)? = claims["sub"] else { throw refuse(.invalidUserToken, "The user token has no sub (the app user id).") }
        guard let exp = number("exp") else {
            throw refuse(.invalidUserToken, "The user token has no exp (Unix seconds).")
        }
        let nowSeconds = now.timeIntervalSince1970
        guard exp > nowSeconds - Self.allowedSkew else { throw refuse(.userTokenExpired, "The user token expired; mint a new one.") }
        guard exp <= nowSeconds + Self.maximumLifetime + Self.allowedSkew else {
            throw refuse(.invalidUserToken, "A user token may live at most 24 hours (exp is too far ahead).")
        }
        if let nbf = number("nbf"), nbf > nowSeconds + Self.allowedSkew {
            throw refuse(.invalidUserToken, "The user token is not valid yet (nbf).")
        }
        switch claims["aud"] {
        case nil: break
        case .string(let audience)? where audience == app.id: break
        case .array(let audiences)? where audiences.contains(.string(app.id)) && audiences.allSatisfy({ if case .string = $0 { true } else { false } }):
            break
        default: throw refuse(.invalidUserToken, "The user token is for another app (aud must be, or list, \(app.id)).")
        }
        do { self.subject = try ClientIdentifier(subject, .appUserId).value } catch { throw refuse(.invalidUserToken, "The user token's sub is not a valid user id.") }
        expiresAt = Date(timeIntervalSince1970: exp)
    }

    /// A fresh HS256 secret: 32 random bytes, Base64url.
    public static func generateSecret() -> String { Base64URL.encode(SecretBox.generateKey()) }

    /// Mints a token (tests, the CLI's worked example); a developer's backend does the same in any language.
    public static func mint(subject: String, expiresIn: TimeInterval, secret: String, now: Date) -> String {
        var header = JSONBuffer(capacity: 64)
        header.object { json in
            json.field("alg", "HS256")
            json.field("typ", "JWT")
        }
        var claims = JSONBuffer(capacity: 128)
        claims.object { json in
            json.field("exp", Int64(now.timeIntervalSince1970 + expiresIn))
            json.field("sub", subject)
        }
        let input = Base64URL.encode(header.bytes) + "." + Base64URL.encode(claims.bytes)
        return input + "." + Base64URL.encode(HMAC.sha256(key: Array(secret.utf8), message: Array(input.utf8)))
    }
}
