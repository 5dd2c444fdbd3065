//! The codec every generated client and server uses: prost's, except that bytes
//! which are no valid message of the method's type are the sender's mistake
//! (`INVALID_ARGUMENT`, naming the decode error), never allotd's (`INTERNAL`).

use prost::Message;
use std::marker::PhantomData;
use tonic::codec::{BufferSettings, Codec as TonicCodec, DecodeBuf, Decoder as TonicDecoder};
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// prost's codec with malformed input answered `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct Codec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(PhantomData)
    }
}

impl<T, U> TonicCodec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = Decoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder(ProstCodec::<T, U>::raw_decoder(BufferSettings::default()))
    }
}

/// prost's decoder, its errors turned into `INVALID_ARGUMENT`.
#[derive(Debug)]
pub struct Decoder<U>(ProstDecoder<U>);

impl<U: Message + Default> TonicDecoder for Decoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(senders_mistake::<U>)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

/// prost's parse error (`INTERNAL`) as the sender's mistake, naming the message type.
fn senders_mistake<U>(e: Status) -> Status {
    if e.code() != Code::Internal {
        return e;
    }
    let name = std::any::type_name::<U>();
    Status::invalid_argument(format!(
        "message: not a valid encoding of {} ({}); is the sender built from the same allot.v1 proto?",
        name.rsplit("::").next().unwrap_or(name),
        e.message()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1 as pb;

    #[test]
    fn bytes_that_are_no_message_are_the_senders_mistake() {
        // What prost says of a string field promising 100 bytes and holding 2.
        let err = <pb::GetRequest as Message>::decode(&[0x0a, 100, b'a', b'b'][..])
            .expect_err("malformed");
        let e = senders_mistake::<pb::GetRequest>(Status::internal(err.to_string()));
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(
            e.message()
                .starts_with("message: not a valid encoding of GetRequest (failed to decode"),
            "{}",
            e.message()
        );
        // Any other refusal passes as it was.
        let e = senders_mistake::<pb::GetRequest>(Status::resource_exhausted("too big"));
        assert_eq!(e.code(), Code::ResourceExhausted);
    }
}
