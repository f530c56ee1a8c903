// llama2.c's tokenizer file (tok.bin / tokenizer.bin) as GGUF tokenizer metadata: a SentencePiece
// vocabulary (model "llama") with scores, <unk>/<s>/</s> and the 256 <0xXX> byte tokens.
#pragma once

#include <string>

#include "formats/gguf_metadata.h"

namespace roofline {

// Format: int32 max_token_length, then per token: float32 score, int32 length, bytes. Token texts
// use ' ' where SentencePiece uses U+2581; they are stored with U+2581 in the metadata.
void add_llama2c_tokenizer_metadata(gguf::Metadata& metadata, const std::string& path, int n_vocab = 0);

}  // namespace roofline
