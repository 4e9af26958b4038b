#include "serve/webui.h"

/* The assembler's .incbin puts the file's bytes in as they are (no generated source to keep in
   step; the Makefile makes this object depend on the page), then a NUL. */
__asm__(".pushsection .rodata\n"
        ".globl nv_webui_page\n"
        ".type nv_webui_page, @object\n"
        "nv_webui_page:\n"
        ".incbin \"src/serve/webui.html\"\n"
        ".byte 0\n"
        ".size nv_webui_page, . - nv_webui_page\n"
        ".popsection\n");
