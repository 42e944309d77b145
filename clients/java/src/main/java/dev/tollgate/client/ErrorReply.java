package dev.tollgate.client;

/** The daemon's `Error` reply: act on the code, log the message. */
public record ErrorReply(ErrorCode code, String message) {
}
