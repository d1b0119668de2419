// Escaping of untrusted bytes (from a client or a data file) before they
// reach an error message or a log line.
#pragma once

#include <string>
#include <string_view>

namespace dlrm {

// `text` with every byte outside printable ASCII (NUL, newlines, DEL, bytes
// >= 0x80) written as a C escape ("\n", "\t", "\r", "\x00"). Printable
// bytes, backslashes and quotes stay, so the result is one printable line
// and escaping it again changes nothing.
inline std::string EscapeForMessage(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(ch);
    } else if (c == '\n') {
      out.append("\\n");
    } else if (c == '\t') {
      out.append("\\t");
    } else if (c == '\r') {
      out.append("\\r");
    } else {
      const char escape[] = {'\\', 'x', kHex[c >> 4], kHex[c & 0xf]};
      out.append(escape, sizeof(escape));
    }
  }
  return out;
}

}  // namespace dlrm
