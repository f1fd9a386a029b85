// A failed call as a typed error: the gRPC code and message, and the
// `google.rpc` details the daemon sends in `grpc-status-details-bin`
// (ErrorInfo: a stable reason and its metadata; BadRequest: one violation
// per offending field).
import { BinaryReader } from '@bufbuild/protobuf/wire';
import { Metadata, ServiceError, status as Status } from '@grpc/grpc-js';

/** One offending field of a request. */
export interface FieldViolation {
  field: string;
  description: string;
}

/** A call the daemon (or the transport) answered with an error. */
export class BrokerError extends Error {
  /** The gRPC status code (`@grpc/grpc-js`'s `status`). */
  readonly code: Status;
  /** The code's name, e.g. `INVALID_ARGUMENT`. */
  readonly codeName: string;
  /** The daemon's message. */
  readonly details: string;
  /** `ErrorInfo.reason`, e.g. `SESSION_NOT_FOUND`; empty when not sent. */
  readonly reason: string;
  /** `ErrorInfo.domain` (`ctxbroker.v1`). */
  readonly domain: string;
  /** `ErrorInfo.metadata`: sizes, ids, the plan to approve... */
  readonly info: Record<string, string>;
  /** `BadRequest` field violations. */
  readonly fieldViolations: FieldViolation[];
  /** The trailers (e.g. `resume-from-seq` of a daemon shutting down). */
  readonly trailers: Metadata | undefined;

  constructor(code: Status, details: string, trailers?: Metadata) {
    const codeName = Status[code] ?? String(code);
    super(`${codeName}: ${details}`);
    this.name = 'BrokerError';
    this.code = code;
    this.codeName = codeName;
    this.details = details;
    this.trailers = trailers;
    const decoded = decodeDetails(trailers);
    this.reason = decoded.reason;
    this.domain = decoded.domain;
    this.info = decoded.info;
    this.fieldViolations = decoded.fieldViolations;
  }

  /** From a grpc-js error. */
  static from(error: unknown): BrokerError {
    if (error instanceof BrokerError) return error;
    const e = error as Partial<ServiceError>;
    if (typeof e?.code === 'number') {
      return new BrokerError(e.code, e.details ?? e.message ?? '', e.metadata);
    }
    return new BrokerError(Status.UNKNOWN, error instanceof Error ? error.message : String(error));
  }
}

const ERROR_INFO = 'type.googleapis.com/google.rpc.ErrorInfo';
const BAD_REQUEST = 'type.googleapis.com/google.rpc.BadRequest';

interface Decoded {
  reason: string;
  domain: string;
  info: Record<string, string>;
  fieldViolations: FieldViolation[];
}

/** Reads `google.rpc.Status.details` from the trailers; what cannot be
 * read is left out rather than thrown. */
function decodeDetails(trailers: Metadata | undefined): Decoded {
  const out: Decoded = { reason: '', domain: '', info: {}, fieldViolations: [] };
  const raw = trailers?.get('grpc-status-details-bin')[0];
  if (!(raw instanceof Buffer)) return out;
  try {
    for (const any of fields(raw, 3)) {
      const { typeUrl, value } = readAny(any);
      if (typeUrl === ERROR_INFO) readErrorInfo(value, out);
      if (typeUrl === BAD_REQUEST) {
        for (const v of fields(value, 1)) out.fieldViolations.push(readViolation(v));
      }
    }
  } catch {
    // Malformed details: the code and message still stand.
  }
  return out;
}

/** The length-delimited values of field `number` in `bytes`. */
function fields(bytes: Uint8Array, number: number): Uint8Array[] {
  const reader = new BinaryReader(bytes);
  const out: Uint8Array[] = [];
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    if (field === number && wireType === 2) out.push(reader.bytes());
    else reader.skip(wireType);
  }
  return out;
}

/** The first string of field `number`. */
function text(bytes: Uint8Array, number: number): string {
  const [value] = fields(bytes, number);
  return value === undefined ? '' : Buffer.from(value).toString('utf8');
}

function readAny(bytes: Uint8Array): { typeUrl: string; value: Uint8Array } {
  return { typeUrl: text(bytes, 1), value: fields(bytes, 2)[0] ?? new Uint8Array() };
}

function readErrorInfo(bytes: Uint8Array, out: Decoded): void {
  out.reason = text(bytes, 1);
  out.domain = text(bytes, 2);
  for (const entry of fields(bytes, 3)) out.info[text(entry, 1)] = text(entry, 2);
}

function readViolation(bytes: Uint8Array): FieldViolation {
  return { field: text(bytes, 1), description: text(bytes, 2) };
}
