# Writes OUT, a C++ file defining dlrm::internal::Presets() from the
# configs/*.textproto files in IN_DIR (invoked with cmake -P).
file(GLOB files ${IN_DIR}/*.textproto)
list(SORT files)
set(body "// Generated from configs/*.textproto by core/embed_presets.cmake.\n#include \"core/presets.h\"\n\nnamespace dlrm::internal {\nnamespace {\nconstexpr Preset kPresets[] = {\n")
foreach(f ${files})
  get_filename_component(name ${f} NAME_WE)
  file(READ ${f} text)
  string(APPEND body "    {\"${name}\", R\"dlrmpreset(${text})dlrmpreset\"},\n")
endforeach()
string(APPEND body "};\n}  // namespace\n\nstd::span<const Preset> Presets() { return kPresets; }\n\n}  // namespace dlrm::internal\n")
file(WRITE ${OUT}.tmp "${body}")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
