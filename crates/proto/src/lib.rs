//! The `ctxbroker.v1` wire contract.
//!
//! Generated at build time from `proto/ctxbroker/v1/*.proto` with protox and
//! tonic-prost-build; nothing here is written by hand but this module and
//! [`encoded`], the server's pre-encoded watch responses. Every client, in
//! every language, is generated from the same `.proto` files.

pub mod encoded;

/// The `ctxbroker.v1` package: messages, the `ContextBroker` client and
/// server. The server's `WatchCompactions` streams
/// [`Encoded`](encoded::Encoded) responses; everything else is as
/// generated.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod v1 {
    tonic::include_proto!("ctxbroker.v1");
    // Generated apart, over the messages above (see `build.rs`).
    include!(concat!(env!("OUT_DIR"), "/server/ctxbroker.v1.rs"));
}

/// The encoded `FileDescriptorSet` of the contract, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("ctxbroker_descriptor");

#[cfg(test)]
mod tests {
    use prost::Message;

    #[test]
    fn descriptor_set_holds_the_service() {
        let set = prost_types::FileDescriptorSet::decode(super::FILE_DESCRIPTOR_SET)
            .expect("the embedded descriptor set decodes");
        let file = set
            .file
            .iter()
            .find(|f| f.package() == "ctxbroker.v1")
            .expect("the ctxbroker.v1 file is in the set");
        let service = file
            .service
            .iter()
            .find(|s| s.name() == "ContextBroker")
            .expect("ContextBroker is declared");
        for rpc in [
            "CreateSession",
            "Admit",
            "AdmitStream",
            "WatchCompactions",
            "GetServerInfo",
        ] {
            assert!(
                service.method.iter().any(|m| m.name() == rpc),
                "{rpc} is missing from the contract"
            );
        }
    }
}
