// Helper of tests/bpe_check.py: GPT-2 BPE token ids of a text file.
//
//   bpe_tool TOKENIZER_DIR TEXT_FILE
//
// Prints the ids of the file's text (data/gpt2_bpe.h), space-separated, on one line; exits 1
// when decoding them does not give the text back.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "data/gpt2_bpe.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: bpe_tool TOKENIZER_DIR TEXT_FILE\n";
    return 2;
  }
  try {
    const trainer::data::Gpt2Tokenizer tokenizer(argv[1]);
    std::ifstream in(argv[2], std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    std::string back;
    for (const int64_t id : tokenizer.encode(text.str())) {
      std::cout << id << " ";
      back += tokenizer.decode(id);
    }
    std::cout << "\n";
    if (back != text.str()) {
      std::cerr << "bpe_tool: decoding the ids does not give the text back\n";
      return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "bpe_tool: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
